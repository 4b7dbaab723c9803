"""The vectors' pairwise products kept as a run stores them, so the first ``cluster`` after a crawl reads them.

The first ``cluster`` of a large population spends most of its time on every pairwise inner product (at 10,000
vectors of 100,000 floats, 5·10¹² multiply-adds: 40 s on two cores at best). A crawl of the Hub waits on the
network for hours with the processor mostly idle, so a run that stores vectors of a base with at least
``products_from`` of them keeps those products beside the store as it goes, in a thread of its own: whenever the
vectors committed since the last update are a twentieth of those kept (and at least :data:`STEP`), their rows are
computed (each new vector against every stored one, read once: :meth:`Population.products`, the same kept file
``cluster`` reads and verifies), and once more at the run's end for the last ones. Each pair is computed once over
the whole crawl, as in one first run. An update that cannot be made (too little memory, a damaged vector) is said
in one line and leaves the run alone: ``cluster`` computes what is missing.
"""

from __future__ import annotations

import threading
import time
from types import TracebackType

from ..analyse.inputs import Scoring
from ..represent.representation import Representation
from ..store import Population, Store
from ..store.derived.products import Compute
from ..store.views.listed import lists_of

#: The fewest new vectors an update computes during a run (the run's end takes whatever is left).
STEP = 256


class ProductsCacheUpdater:
    """Keeps the products of ``base``'s vectors under ``representation`` up to date while a run stores them
    (``with keeper:`` around the run, :meth:`added` after each stored vector). ``products_from``: the population it
    starts at (0: never). ``device``: where the float32 products run (``Compute``'s meaning). ``step``: the fewest
    new vectors an update computes during the run. After the run, ``line`` says what it did (None: nothing) and
    ``computed`` holds the rows each update computed and ``seconds`` the seconds each took (the last: the one the
    run's end waited for)."""

    def __init__(
        self,
        db: Store,
        base: str,
        representation: Representation,
        products_from: int,
        device: str = "auto",
        *,
        step: int = STEP,
    ) -> None:
        self.db, self.base, self.representation = db, base, representation
        self.products_from, self.device, self.step = products_from, device, step
        self.line: str | None = None
        self.computed: list[int] = []
        self.seconds: list[float] = []
        #: the base's population (:class:`Population`: its vectors, copies and stale ones left out) at the last look:
        #: whose products the last update kept, or found too few to keep; the one count the keeper goes by
        self._population = 0
        self._added = 0  # vectors stored by this run since the last look
        self._any = False  # whether this run stored any
        self._lock = threading.Lock()
        self._problem = ""
        self._due = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="modelvec-products", daemon=True)

    def __enter__(self) -> ProductsCacheUpdater:
        if self.products_from > 0:
            try:
                self._population = len(Population(self.db, self.base, self.representation).selection)
            except Exception:  # nothing of this base stored yet, or nothing readable now: the updates say why
                self._population = 0
            self._thread.start()
        return self

    def added(self) -> None:
        """One more vector stored (or queued for the store): an update is due once enough have come."""
        with self._lock:
            self._added += 1
            self._any = True
            due = self._population + self._added >= self.products_from and self._added >= max(
                self.step, self._population // 20
            )
        if due and self.products_from > 0:
            self._due.set()

    @property
    def ends_with_an_update(self) -> bool:
        """Whether leaving (after a run that ended) makes a last update: it runs, and this run stored vectors."""
        return self._thread.ident is not None and self._any

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        """After a run that ended: the last update, made here (the store's writer has committed every vector). After
        an interrupted one: nothing more (an update in flight keeps its file whole or not at all)."""
        self._stop.set()
        self._due.set()
        if self._thread.ident is None or kind is not None:  # never started, or the run was interrupted
            return
        self._thread.join()
        if self._any:  # every vector committed now, those an update missed while queued included
            self._update()
        if self._problem:
            self.line = f"the vectors' products were not kept for the map ({self._problem}): cluster computes them"
        elif self.computed:
            self.line = (
                f"the pairwise products of {self._population:,} vectors are kept for the map ({sum(self.computed):,} new in"
                f" this run, {sum(self.seconds):.1f} s)"
            )

    def _loop(self) -> None:
        while True:
            self._due.wait()
            self._due.clear()
            if self._stop.is_set():
                return
            self._update()

    def _update(self) -> None:
        """Compute and keep the products of the vectors stored since the last update (none: only verifies). A
        population still below ``products_from`` is counted and left: the next look is due only after as many new
        vectors as any update waits for, not at every one."""
        started = time.perf_counter()
        with self._lock:
            added = self._added
        try:
            with self.db.for_thread() as view:
                population = Population(view, self.base, self.representation)
                n = len(population.selection)
                if n < self.products_from:
                    self._looked(added, n)
                    return
                if Compute().neighbours_for(n) == "lists":  # too many for every pair: the nearest lists cluster reads
                    scoring, _ = population.resolve(Scoring(), list(population.meta["adapter"]))
                    computed = lists_of(population, population.meta, scoring).computed
                else:
                    products, _ = population.products(verify=False, device=self.device)
                    n, computed = len(products.positions), products.computed_rows
        except Exception as exc:  # whatever it is, the run goes on (said in its line); cluster computes the rest
            self._problem = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            return
        self._problem = ""
        self._looked(added, n)
        self.computed.append(computed)
        self.seconds.append(time.perf_counter() - started)

    def _looked(self, added: int, population: int) -> None:
        """The ``added`` vectors are in the population now, ``population`` of them."""
        with self._lock:
            self._added -= added
            self._population = population
