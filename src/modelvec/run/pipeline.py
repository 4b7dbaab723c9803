"""The embedding pipeline: many fine-tunes of one base, through the store, failures recorded.

Models are local folders or files, Hub ids, or catalogue entries from discovery. A Hub model is
identified by its commit sha, so a stored vector is recognised before anything is downloaded; its
files are fetched pinned to that sha and, with ``keep_weights=False``, deleted once embedded. The
base is read once, lazily: a run where everything is stored never reads it. The work itself runs
in an engine (:mod:`modelvec.run.engines`): threads here that download and prefetch the next models
while one is computed, or tasks on a Ray cluster. This driver decides what to compute and writes
the store from a background writer as outcomes arrive, so an interrupted run keeps everything
committed and a re-run computes only what is missing; a bad model is recorded as failed with its
one-line reason and the run goes on.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence, Sized
from dataclasses import dataclass, field, replace
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..core.errors import CheckpointError, FetchError, Kind, ModelvecError, error_of
from ..core.files import ADAPTER_CONFIG, oldest_time
from ..core.names import is_hub_id, model_id
from ..core.settings import taken_from, with_options
from ..hub.client import HUB_REFUSED, HubSettings, describe_error, with_retries
from ..hub.discovery import CatalogueEntry, Resume, Scope, describe
from ..hub.download import download_file, fetch, resolve_revision, weights_identity
from ..hub.ids import resolve_base
from ..read import Checkpoint, adapter_parent, open_checkpoint, refuse_adapter_base
from ..represent.representation import Representation
from ..store import Failure, Store, VectorRow, opened
from ..store.records import Alias, CardUpdate
from ..store.vectorfile import checksum, vector_bytes
from .discover import catalogue_entries, discovered, resumable, stored_pages
from .engines import Engine, Execution, make_engine
from .keeper import ProductsKeeper
from .work import BaseSpec, Outcome, Task, files_id

PathLike = str | os.PathLike[str]


@dataclass
class EmbedResult:
    """What ``embed`` did: the vectors of the requested models that are stored, and what failed."""

    vectors: np.ndarray
    metadata: pd.DataFrame
    embedded: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    store: str | None = None  # the store file written
    #: how some models were read, said once per run: note -> the models it concerns (e.g. downloaded whole)
    notes: dict[str, list[str]] = field(default_factory=dict)
    #: the failed models whose failure was recorded by an earlier run and not tried again (``force`` retries)
    recorded: list[str] = field(default_factory=list)
    #: what the run kept of the vectors' products for the map, one line (None: nothing; ``products_from``)
    kept_products: str | None = None
    #: the models given under a second name (the same weight files as a stored model): alias -> the stored model
    aliases: dict[str, str] = field(default_factory=dict)
    #: the models whose weights are another stored model's bit for bit (a mirror): model -> that model; stored, and
    #: counted once in every report, as the original (``tree`` says which and why)
    same_weights: dict[str, str] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        """What was embedded, skipped and failed (model -> reason), and where; the vectors are in the store."""
        return {
            "store": self.store,
            "embedded": list(self.embedded),
            "skipped": list(self.skipped),
            "failed": dict(self.failed),
            "notes": {note: list(models) for note, models in self.notes.items()},
            "recorded": list(self.recorded),
            "kept_products": self.kept_products,
            "aliases": dict(self.aliases),
            "same_weights": dict(self.same_weights),
        }


@dataclass(frozen=True)
class Step:
    """A run's progress, as a display needs it (``embed(..., on_step=...)``): how many models there are, then each
    model's end with the bytes it cost.

    ``status`` is ``"begin"`` once, when the run's models are known (``total``: their number, None for a stream of
    unknown length), before anything is fetched; then one of ``"embedded"``, ``"skipped"`` (already stored) and
    ``"failed"`` per model, with ``detail`` (the failure's one line) and its ``kind`` for a failure; and
    ``"keeping"`` once at the end where the run then keeps the vectors' products for the map (``products_from``). ``fetched`` is
    what this run added to the Hub cache for the model: the bytes it holds of the model's files (0 for a local
    model or one already cached; bytes of retried answers are not counted, see the Hub's own count for those).
    """

    status: str
    model: str = ""
    detail: str = ""
    total: int | None = None
    fetched: int = 0
    kind: str | None = None


OnStep = Callable[[Step], None]


Model = PathLike | str | CatalogueEntry

#: What a run says of the models it embedded again because the base changed since they were stored (once a run).
BASE_CHANGED = (
    "the base has changed since these were embedded against it: embedded again against the base as it is now "
    "(the reports use these; `modelvec compact` drops the vectors of the earlier version)"
)
#: What a run says of stored models whose card changed since (once a run).
CARD_CHANGED = "their cards changed since they were stored: their labels read again, their vectors kept"
#: What a run says of a quantization (a GGUF file): its trace is taken, it is no point on the map.
QUANTIZED = "a quantization ({}): its trace places it in the model tree; it is left off the map and out of every score"
#: What a run says of a model whose weights are the base's (a re-upload of it, an untrained adapter).
COPY_OF_BASE = (
    "its weights are the base's in every matrix read (a copy of the base): stored as such, left off the map and "
    "out of every score"
)


def embed(
    base: PathLike | str,
    models: Iterable[Model],
    *,
    representation: Representation | None = None,
    execution: Execution | None = None,
    store: Store | PathLike | None = None,
    force: bool = False,
    hub_settings: HubSettings | None = None,
    load: bool = True,
    on_step: OnStep | None = None,
    **fields: Any,
) -> EmbedResult:
    """Embed fine-tunes of ``base`` into the store and return their vectors and metadata.

    ``base`` and each model are a local folder or weights file, or a Hub id (models may also be
    :class:`CatalogueEntry` from :func:`discover`). The representation is ``representation`` or
    built from keyword parameters (``rank=8, factor="sketch", pooling="mean", ...``; see
    :class:`Representation`); where and how it runs is ``execution`` (:class:`~modelvec.run.engines.Execution`),
    whose settings may also be given one by one (``workers=4, device="cpu"``). Models already stored with the same
    weights (files unchanged, or commit sha for Hub models), base and representation are skipped unless ``force``. A
    model that fails is recorded (``result.failed``: model -> reason) and the run goes on. Hub models
    are fetched through the huggingface_hub cache; ``keep_weights=False`` deletes each one's
    files once embedded (the base stays). ``store=None`` uses ``$MODELVEC_STORE`` or
    ``./modelvec.duckdb``.

    ``engine="local"`` computes here while ``workers`` I/O threads (default 2) fetch and prefetch
    the next models; ``engine="ray"`` runs each model as a task on the Ray cluster at ``address``
    (default: a local one), ``workers`` actors (default: one per CPU). ``load=False`` returns
    no vectors (for runs too large to hold them; read them with :meth:`Store.load`).

    ``on_step`` gets a :class:`Step` once the number of models is known, then as each model ends, with the bytes it
    cost (what a progress bar shows).
    """
    execution = with_options(Execution, execution, taken_from(Execution, fields), "embed")
    chosen = with_options(Representation, representation, fields, "embed")
    hub_settings = hub_settings or HubSettings()
    runner = make_engine(execution)
    report = on_step or (lambda _: None)
    with opened(store) as db:
        return _run(base, models, chosen, db, force, report, hub_settings, execution, runner, load)


def embed_discovered(
    base: str,
    scope: Scope | None = None,
    *,
    refresh: bool = False,
    store: Store | PathLike | None = None,
    hub_settings: HubSettings | None = None,
    **kwargs: Any,
) -> EmbedResult:
    """Embed every discovered fine-tune of the Hub model ``base``, as far as ``scope`` says (at most ``limit``, most
    downloaded first; its settings may also be given one by one: ``limit=10``).

    The catalogue stored by an earlier discovery is used when that discovery ended. Otherwise (``refresh``, none, or
    one that was stopped) discovery runs in a thread beside the embedding: each listing page is stored as it comes
    (:func:`~modelvec.run.discover.discover_pages`), from where a stopped one left off, and each model found is
    embedded as soon as it is found (the models a stopped run had found come first). Other keyword arguments go to
    :func:`embed`.
    """
    scope = with_options(Scope, scope, taken_from(Scope, kwargs), "embed_discovered")
    hub_settings = hub_settings or HubSettings()
    canonical = resolve_base(base).canonical
    with opened(store) as db:
        if not refresh and discovered(db, base, scope):
            entries = scope.ordered(catalogue_entries(db, canonical, kept=True))
            return embed(canonical, entries, store=db, hub_settings=hub_settings, **kwargs)
        resume = resumable(db, base, scope, refresh)
        found = [e for e in resume.entries if e.kept] if resume is not None else []
        with _Discovering(base, scope, db, resume, hub_settings) as stream:
            return embed(canonical, chain(found, stream), store=db, hub_settings=hub_settings, **kwargs)


class _Discovering:
    """Discovery in a thread of its own, its kept models handed over as they are found (a producer and its
    consumer): iterating gives them, then ends when discovery does (its error, if any, is raised there). Entering
    waits for the first page to be stored, so the run finds the base's revision in the store."""

    _END = object()

    def __init__(self, base: str, scope: Scope, db: Store, resume: Resume | None, hub_settings: HubSettings) -> None:
        self.queue: queue.Queue[Any] = queue.Queue()
        self.stop = threading.Event()
        self.first = threading.Event()
        self.thread = threading.Thread(
            target=self._produce, args=(base, scope, db, resume, hub_settings), name="modelvec-discovery", daemon=True
        )

    def _produce(self, base: str, scope: Scope, db: Store, resume: Resume | None, hub_settings: HubSettings) -> None:
        try:
            for page in stored_pages(base, scope, db, resume, hub_settings=hub_settings):
                self.first.set()
                if page.done or self.stop.is_set():
                    break
                for entry in page.entries:
                    if entry.kept:
                        self.queue.put(entry)
        except BaseException as exc:  # handed to the consumer, raised where it iterates
            self.queue.put(exc)
        finally:
            self.first.set()
            self.queue.put(self._END)

    def __iter__(self) -> Iterator[CatalogueEntry]:
        while True:
            item = self.queue.get()
            if item is self._END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def __enter__(self) -> _Discovering:
        self.thread.start()
        self.first.wait()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def _run(
    base: PathLike | str,
    models: Iterable[Model],
    representation: Representation,
    db: Store,
    force: bool,
    report: OnStep,
    hub_settings: HubSettings,
    execution: Execution,
    engine: Engine,
    load: bool,
) -> EmbedResult:
    try:
        spec = _base(base, db, hub_settings)
    except ModelvecError as exc:
        if HUB_REFUSED not in str(exc):
            raise
        spec = BaseSpec(resolve_base(str(base)).canonical, "", repo=str(base))  # never opened: nothing is tried
        down = _Run(spec, representation, db, force, report, hub_settings)
        down.hub_down = describe_error(exc)
        report(Step(status="begin", total=len(models) if isinstance(models, Sized) else None))
        with down.writer:
            for _ in down.todo(models):
                pass
        return down.result
    spec = replace(spec, store=str(db.path))  # the base's probe inputs, where it takes them, are kept beside it
    run = _Run(spec, representation, db, force, report, hub_settings)
    report(Step(status="begin", total=len(models) if isinstance(models, Sized) else None))
    keeper = ProductsKeeper(db, spec.name, representation, execution.products_from, execution.device)
    with keeper, run.writer:  # the writer closes first: the keeper's last update sees every vector
        for outcome in engine.run(spec, representation, run.todo(models), hub_settings, execution.keep_weights):
            if run.record(outcome):
                keeper.added()
        if keeper.ends_with_an_update:
            report(Step(status="keeping", detail="the vectors' pairwise products, for the map"))
    run.result.kept_products = keeper.line
    if load:
        run.result.vectors, run.result.metadata = db.load(spec.name, representation, models=run.wanted)
    return run.result


class _Run:
    """One run's state: the models asked for, what it wrote and said of each (``result``), and the store's writer
    that commits outcomes as they arrive."""

    def __init__(
        self,
        spec: BaseSpec,
        representation: Representation,
        db: Store,
        force: bool,
        report: OnStep,
        hub_settings: HubSettings,
    ) -> None:
        self.spec, self.representation, self.db, self.force = spec, representation, db, force
        self.report, self.hub_settings = report, hub_settings
        self.result = EmbedResult(vectors=np.zeros((0, 0), np.float32), metadata=pd.DataFrame(), store=str(db.path))
        self.wanted: list[str] = []  # every model asked for, in order (the vectors loaded at the end)
        self.writer = db.writer()
        self.hub_down: str | None = None  # the line said once the Hub refused connections: nothing more is tried
        self.files: dict[str, str] = {}  # the local weight files of this run's models (files_id -> its first name)
        self.vectors: dict[str, str] = {}  # the checksums of this run's vectors (-> the first model of each)

    def fail(self, name: str, error: str, model_version: str | None, kind: Kind, fetched: int = 0) -> None:
        """A model failed now: recorded in the store (with its kind) and in the result."""
        self.writer.put(
            Failure(
                model=name,
                base=self.spec.name,
                representation=self.representation,
                error=error,
                model_version=model_version,
                kind=kind,
            )
        )
        self.result.failed[name] = error
        self.report(Step(status="failed", model=name, detail=error, fetched=fetched, kind=Kind(kind).value))
        if HUB_REFUSED in error and self.hub_down is None:
            self.hub_down = error.split(": ", 1)[-1] if error.startswith(f"{name}: ") else error

    def not_tried(self, name: str) -> None:
        """A model left when the Hub refused connections: recorded as a transient failure (tried next run), said
        once in the run's notes."""
        line = f"{self.hub_down}: the models left were not tried, recorded as transient failures (tried next run)"
        self.result.notes.setdefault(line, []).append(name)
        self.fail(name, f"{name}: not tried: {self.hub_down}", None, Kind.TRANSIENT)

    def todo(self, models: Iterable[Model]) -> Iterator[Task]:
        """The models that need computing; the rest are skipped or known failures (checked lazily)."""
        spec, representation, db = self.spec, self.representation, self.db
        for model in models:
            name = model.model if isinstance(model, CatalogueEntry) else model_id(model)
            self.wanted.append(name)
            if self.hub_down is not None:
                self.not_tried(name)
                continue
            if self._stored(model, name):  # known by its catalogued commit: nothing is asked of the Hub for it
                continue
            try:
                task = _task(model, spec, db, self.hub_settings)
            except Exception as exc:
                err = error_of(exc, name)
                if err.model == spec.name:
                    raise err from exc
                self.fail(name, str(err), None, err.kind)
                continue
            if self._settled(task):
                continue
            known = None if self.force else db.known_failure(name, task.version, spec.name, representation)
            if known is not None:  # the same weights failed before: not fetched or read again (--force retries)
                self.result.failed[name] = known
                self.result.recorded.append(name)
                self.report(Step(status="failed", model=name, detail=known, kind=Kind.CONTENT.value))
                continue
            if any(h != spec.version for h in db.model_versions(name, spec.name, representation)):
                self.result.notes.setdefault(BASE_CHANGED, []).append(name)
            yield task

    def _same_vector(self, name: str, vector: np.ndarray) -> str | None:
        """Another model, stored or embedded in this run, whose vector is this one bit for bit: the same weights."""
        digest = checksum(vector_bytes(vector))
        first = self.vectors.setdefault(digest, name)
        if first != name:
            return first
        spec = self.spec
        return self.db.same_vector(digest, name, spec.name, spec.version, self.representation)

    def _settled(self, task: Task) -> bool:
        """Whether nothing is to be computed for ``task``: the same weight files as a model stored or embedded in this
        run under another name (an alias: one model, stored once), or already stored (its card read again where it
        changed, or, for a new Hub commit that left its weights as they were, its version and labels updated)."""
        spec, db, name = self.spec, self.db, task.name
        if task.files_id is not None:
            first = self.files.setdefault(task.files_id, name)
            other = (
                first
                if first != name
                else db.same_files(task.files_id, name, spec.name, spec.version, self.representation)
            )
            if other is not None:
                self.writer.put(Alias(base=spec.name, alias=name, model=other))
                self.result.aliases[name] = other
                self.report(Step(status="skipped", model=name, detail=f"an alias of {other}"))
                return True
        if self.force:
            return False
        if db.has(name, task.version, spec.name, spec.version, self.representation):
            self._read_card_again(task)
        elif not self._same_weights(task):
            return False
        self.result.skipped.append(name)
        self.report(Step(status="skipped", model=name, detail="already stored"))
        return True

    def _read_card_again(self, task: Task, version: str | None = None, old: str | None = None) -> None:
        """A stored model's card read again (a local one's from its folder, a Hub one's as its entry has it): where
        it changed since it was stored, its labels and declarations are updated, its vector kept (said once)."""
        stored = self.db.card_of(task.name, self.spec.name)
        card = task.card()
        if stored is None or (version is None and card.digest in (None, stored[0])):  # None: the catalogue's own
            return
        update = CardUpdate(
            model=task.name,
            base=self.spec.name,
            card_hash=card.digest,
            datasets=card.datasets,
            label_source=card.label_source,
            author=card.author,
            relation=card.relation,
            parents=card.parents,
            model_version=version,
            old_version=old,
        )
        self.writer.put(update)
        if sorted(stored[1]) != sorted(card.datasets):
            was, now = ", ".join(sorted(stored[1])) or "none", ", ".join(sorted(card.datasets)) or "none"
            self.result.notes.setdefault(CARD_CHANGED, []).append(f"{task.name}: {was} -> {now}")

    def _same_weights(self, task: Task) -> bool:
        """A Hub model stored at an earlier commit whose weights the new commit leaves as they were (a card edited,
        say; asked of the Hub's file listings): its stored version moves to the new commit, its card is read again,
        nothing is fetched. False where the weights changed, or the Hub cannot tell."""
        if task.repo is None or task.sha is None or self.hub_settings.offline:
            return False
        spec = self.spec
        old = self.db.stored_version(task.name, spec.name, spec.version, self.representation)
        if old is None or not old.startswith("git:") or old == task.version:
            return False
        try:
            now = weights_identity(task.repo, task.sha, self.hub_settings)
            same = now is not None and weights_identity(task.repo, old.removeprefix("git:"), self.hub_settings) == now
        except ModelvecError:  # the Hub cannot say: embedded again, as before
            return False
        if same:
            self._read_card_again(task, task.version, old)
        return same

    def _stored(self, model: Model, name: str) -> bool:
        """A catalogued Hub model stored at its commit: skipped before its task is made (an adapter's task fetches
        its adapter_config.json, which a stored one need not cost)."""
        if self.force or not isinstance(model, CatalogueEntry) or not model.sha:
            return False
        spec = self.spec
        if not self.db.has(name, f"git:{model.sha}", spec.name, spec.version, self.representation):
            return False
        self.result.skipped.append(name)
        self.report(Step(status="skipped", model=name, detail="already stored"))
        return True

    def record(self, outcome: Outcome) -> bool:
        """An engine's outcome: a failure recorded, or the vector written (True)."""
        task = outcome.task
        if outcome.error is not None:
            self.fail(task.name, outcome.error, task.version, outcome.kind, outcome.fetched)
            return False
        self.writer.put(_row(outcome, self.spec, self.representation))
        self.result.embedded.append(task.name)
        quantized = QUANTIZED.format(outcome.quantized) if outcome.quantized else None
        card = outcome.card.note(task.name) if outcome.card is not None else None
        zero = not np.any(outcome.vector)
        for note in (outcome.note, card, COPY_OF_BASE if zero else None, quantized):
            if note is not None:
                self.result.notes.setdefault(note, []).append(task.name)
        same = None if zero or outcome.vector is None else self._same_vector(task.name, outcome.vector)
        if same is not None:
            self.result.same_weights[task.name] = same
        detail = f"{outcome.seconds:.2f}s"
        self.report(Step(status="embedded", model=task.name, detail=detail, fetched=outcome.fetched))
        return True


def _row(outcome: Outcome, spec: BaseSpec, representation: Representation) -> VectorRow:
    """The store's row of a model's vector."""
    task = outcome.task
    return VectorRow(
        model=task.name,
        model_version=task.version,
        base=spec.name,
        base_version=spec.version,
        representation=representation,
        architecture=str(outcome.architecture),
        vector=outcome.vector,  # type: ignore[arg-type]  # no error: a vector
        datasets=outcome.datasets,
        source=task.source,
        seconds=outcome.seconds,
        label_source=outcome.label_source,
        author=outcome.author,
        adapter=outcome.adapter,
        quantized=outcome.quantized,
        trace=outcome.trace,
        parent=task.parent.name if task.parent is not None else None,
        card_hash=outcome.card.digest if outcome.card is not None else None,
        relation=outcome.card.relation if outcome.card is not None else None,
        parents=outcome.card.parents if outcome.card is not None else None,
        created=task.created,
        files_id=task.files_id,
    )


def _base(base: PathLike | str, db: Store, hub_settings: HubSettings) -> BaseSpec:
    """The base's store name and version (``base_hash``), recorded with its files' stamp so that a report knows
    the version without hashing the base, and how to open it (a Hub base is fetched only when needed).

    A local base's version is its content's hash, computed once per version of its files: a run whose base files'
    stamp (names, sizes, times, headers) was recorded takes the version recorded with it, as a model's files are
    recognised by theirs."""
    if not is_hub_id(base):
        refuse_adapter_base(base, model_id(base))
        ck = Checkpoint(base, name=model_id(base))
        stamp = ck.stamp()
        version = db.recorded_base(ck.name, stamp) or ck.fingerprint()
        db.record_base(ck.name, stamp, version)
        return BaseSpec(ck.name, version, path=str(ck.path))
    canonical = resolve_base(str(base)).canonical
    sha = db.base_sha(canonical) or resolve_revision(canonical, "main", hub_settings)
    stamp = f"git:{sha}"
    version = db.recorded_base(canonical, stamp) or _same_weights(canonical, sha, db, hub_settings) or stamp
    db.record_base(canonical, stamp, version)
    return BaseSpec(canonical, version, repo=canonical, sha=sha)


def _same_weights(canonical: str, sha: str, db: Store, hub_settings: HubSettings) -> str | None:
    """The version recorded last for the Hub base ``canonical`` where its commit ``sha`` holds the same weights as
    the commit that version was recorded at (a commit that changed only the card does not make 10,000 vectors
    stale), asked of the Hub's file listings (two requests, once per new commit of the base); else None."""
    last = db.recorded_base(canonical)
    if last is None or hub_settings.offline:
        return None
    before = [s.removeprefix("git:") for s in db.stamps(canonical, last) if s.startswith("git:")]
    if not before or before[-1] == sha:
        return None
    now = weights_identity(canonical, sha, hub_settings)
    return last if now is not None and weights_identity(canonical, before[-1], hub_settings) == now else None


def _task(model: Model, base: BaseSpec, db: Store, hub_settings: HubSettings) -> Task:
    """A model as a task: a Hub model is identified by its commit sha, a local one by its files' stamp; an adapter
    carries the model it is embedded on where that is not the base (:func:`_adapter_on`)."""
    if isinstance(model, CatalogueEntry) or is_hub_id(model):
        entry = model if isinstance(model, CatalogueEntry) else _hub_entry(str(model), base.name, db, hub_settings)
        if not entry.sha:
            raise CheckpointError(entry.model, "no revision recorded for this model; run discovery again")
        task = Task(
            name=entry.model,
            version=f"git:{entry.sha}",
            source=f"hf://{entry.model}@{entry.sha}",
            repo=entry.model,
            sha=entry.sha,
            files=tuple(entry.files or ()),
            datasets=tuple(entry.datasets),
            label_source=entry.label_source,
            author=entry.author,
            relation=entry.relation,
            parents=tuple(entry.parents or ()),
            created=entry.created_at,
        )
        if ADAPTER_CONFIG not in (entry.files or ()) and entry.relation != "adapter":
            return task
        named = _named_in_config(entry, hub_settings)
        return replace(task, parent=_adapter_on(task.name, named, base, db, hub_settings, entry.parents, hub=True))
    name = model_id(model)
    ck = open_checkpoint(model, name=name)
    task = Task(
        name=name,
        version=ck.stamp(),
        source=str(Path(model)),
        path=str(model),
        created=oldest_time(ck.files),
        files_id=files_id(ck),
    )
    if not ck.factored:
        return task
    return replace(task, parent=_adapter_on(name, adapter_parent(ck.path), base, db, hub_settings))


def _named_in_config(entry: CatalogueEntry, hub_settings: HubSettings) -> str | None:
    """The model a Hub adapter's ``adapter_config.json`` says it adapts (the file is fetched at the adapter's commit,
    into the cache its weights come to)."""
    path = download_file(entry.model, ADAPTER_CONFIG, str(entry.sha), hub_settings)
    return adapter_parent(Path(path).parent)


def _adapter_on(
    adapter: str,
    named: str | None,
    base: BaseSpec,
    db: Store,
    hub_settings: HubSettings,
    declared: Sequence[str] = (),
    *,
    hub: bool = False,
) -> Task | None:
    """The model an adapter is embedded on: the one its ``adapter_config.json`` names (``base_model_name_or_path``),
    whichever way the adapter was listed. None: the base (it names the base, or nothing and its card names no other
    stored model); a full model on this machine; a Hub model, fetched as its parent. A Hub adapter (``hub``) whose
    config names a folder names one on the machine it was trained on: the fine-tune its card names stands for it
    (``declared``). An adapter that names a model that cannot be found, or is not the base, is refused in one line:
    never embedded on another model."""
    if named is None:
        return _declared_parent(declared, base, db, hub_settings)
    if _names_base(named, base, hub=hub):
        return None
    if hub and not is_hub_id(named):  # a folder where it was trained: its card says which model that was
        parent = _declared_parent(declared, base, db, hub_settings)
        if parent is not None:
            return parent
    elif Path(named).is_dir():
        folder = open_checkpoint(named, name=model_id(named))
        if folder.factored:
            raise CheckpointError(adapter, f"its {ADAPTER_CONFIG} names {named}, an adapter too: give the merged model")
        return Task(name=folder.name, version=folder.stamp(), source=str(Path(named)), path=str(named))
    parent = _hub_parent(adapter, named, base, db, hub_settings) if is_hub_id(named) else None
    if parent is not None:  # a Hub model, whatever form the base takes: fetched as the adapter's parent
        if parent.parent is not None or ADAPTER_CONFIG in parent.files:
            raise CheckpointError(adapter, f"its {ADAPTER_CONFIG} names {named}, an adapter too: give the merged model")
        return parent
    where = "on this machine, in the store" + (" (the Hub is offline)" if hub_settings.offline else " or on the Hub")
    raise CheckpointError(
        adapter,
        f"its {ADAPTER_CONFIG} names {named} as the model it adapts, which is not the base ({base.name}) nor a model "
        f"found {where}: embed it with that model as the base, or write the base's folder or id in "
        "base_model_name_or_path",
    )


def _hub_parent(adapter: str, named: str, base: BaseSpec, db: Store, hub_settings: HubSettings) -> Task | None:
    """The Hub model an adapter's config names, as the run can have it: its catalogue entry, else its stored vector's
    commit (embedded earlier, or in this run), else what the Hub says of it now; None where the Hub is offline and
    nothing else has it. A fault of the parent (gone from the Hub, gated) is the adapter's, of its kind."""
    catalogued = catalogue_entries(db, base.name, kept=None, model=named)
    stored = [s for s in db.metadata(base=base.name, models=[named])["source"] if s.startswith(f"hf://{named}@")]
    if not catalogued and not stored and hub_settings.offline:
        return None
    try:
        if catalogued:
            entry = catalogued[0]
        elif stored:
            entry = CatalogueEntry(
                named, base.name, True, "an adapter's parent, stored", sha=stored[-1].rsplit("@", 1)[1]
            )
        else:
            entry = _hub_entry(named, base.name, db, hub_settings)
        return _task(entry, base, db, hub_settings)
    except Exception as exc:  # the parent's fault, said as the adapter's, of its kind
        err = error_of(exc, named)
        raise ModelvecError(adapter, f"its parent {named}: {err.cause}", kind=err.kind) from exc


def _names_base(named: str, base: BaseSpec, *, hub: bool = False) -> bool:
    """Whether an adapter's ``base_model_name_or_path`` names the base: its id or an alias of it, its folder, the
    Hub repository whose cached snapshot the base's folder is, or a folder elsewhere (the trainer's machine: a Hub
    adapter's folder is always there) of the base's name."""
    text = named.strip().rstrip("/")
    if base.repo is not None:
        names = {n.lower() for n in resolve_base(base.name).names} | {base.name.lower()}
        if text.lower() in names:
            return True
        short = {n.rsplit("/", 1)[-1] for n in names}
        elsewhere = hub or not os.path.exists(text)
        return not is_hub_id(text) and elsewhere and Path(text).name.lower() in short
    folder = Path(str(base.path)).resolve()
    if os.path.exists(text) and not hub:
        return Path(text).resolve() == folder
    if is_hub_id(text):
        return f"models--{text.replace('/', '--')}".lower() in (part.lower() for part in folder.parts)
    return Path(text).name == folder.name


def _declared_parent(declared: Sequence[str], base: BaseSpec, db: Store, hub_settings: HubSettings) -> Task | None:
    """The fine-tune a Hub adapter's card names (``base_model:adapter:<parent>``), where it is one of the tree's
    models and not the base: for an adapter whose config names nothing."""
    root = {n.lower() for n in resolve_base(base.name).names} | {base.name.lower()}
    for name in declared:
        if name.lower() not in root:
            found = catalogue_entries(db, base.name, kept=True, model=name)
            if found:
                return _task(found[0], base, db, hub_settings)
    return None


def local_files(name: str, source: str, db: Store, hub_settings: HubSettings | None = None) -> str:
    """A stored model's files on this machine: its path, or a Hub model fetched at its stored revision."""
    hub_settings = hub_settings or HubSettings()
    if source.startswith("hf://") and "@" in source:
        repo, sha = source[len("hf://") :].rsplit("@", 1)
        return str(fetch(repo, sha, None, hub_settings))
    if is_hub_id(name):  # a Hub base
        canonical = resolve_base(name).canonical
        sha = db.base_sha(canonical) or resolve_revision(canonical, "main", hub_settings)
        return str(fetch(canonical, sha, None, hub_settings))
    return name


def _hub_entry(repo_id: str, base: str, db: Store, hub_settings: HubSettings) -> CatalogueEntry:
    """A Hub model named directly: its catalogue entry, or (online) what the Hub says about it now."""
    stored = catalogue_entries(db, base, kept=None, model=repo_id)
    if stored and (hub_settings.offline or stored[0].sha):
        return stored[0]
    try:
        info = with_retries(lambda: hub_settings.api().model_info(repo_id), hub_settings, repo_id)
    except Exception as exc:  # a name given as is: a mistyped local folder reads as a Hub id, so say both
        raise FetchError(
            repo_id, f"no local file or folder of that name, and on the Hub: {describe_error(exc)}"
        ) from exc
    return describe(info, base, True, "named by the user")
