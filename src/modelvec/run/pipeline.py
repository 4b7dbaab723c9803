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
from collections.abc import Iterable, Iterator, Sized
from dataclasses import replace
from itertools import chain
from typing import Any

from ..core.errors import ModelvecError
from ..core.settings import taken_from, with_options
from ..hub.client import HUB_REFUSED, HubSettings, describe_error
from ..hub.discovery import CatalogueEntry, Resume, Scope
from ..hub.ids import resolve_base
from ..represent.representation import Representation
from ..store import Store, opened
from .cache_updates import ProductsCacheUpdater
from .discover import catalogue_entries, discovered, resumable, stored_pages
from .engines import Engine, Execution, make_engine
from .ledger import EmbedResult, Ledger, OnStep, Step
from .tasks import Model, base_spec
from .work import BaseSpec

PathLike = str | os.PathLike[str]


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
    no vectors (for runs too large to hold them; read them with :meth:`~modelvec.store.reads.Reads.load`).

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
        spec = base_spec(base, db, hub_settings)
    except ModelvecError as exc:
        if HUB_REFUSED not in str(exc):
            raise
        spec = BaseSpec(resolve_base(str(base)).canonical, "", repo=str(base))  # never opened: nothing is tried
        down = Ledger(spec, representation, db, force, report, hub_settings)
        down.hub_down = describe_error(exc)
        report(Step(status="begin", total=len(models) if isinstance(models, Sized) else None))
        with down.writer:
            for _ in down.todo(models):
                pass
        return down.result
    spec = replace(spec, store=str(db.path))  # the base's probe inputs, where it takes them, are kept beside it
    run = Ledger(spec, representation, db, force, report, hub_settings)
    report(Step(status="begin", total=len(models) if isinstance(models, Sized) else None))
    keeper = ProductsCacheUpdater(db, spec.name, representation, execution.products_from, execution.device)
    with keeper, run.writer:  # the writer closes first: the keeper's last update sees every vector
        for outcome in engine.run(spec, representation, run.todo(models), hub_settings, execution.keep_weights):
            if run.record(outcome):
                keeper.added()
        if keeper.ends_with_an_update:
            report(Step(status="keeping", detail="the vectors' pairwise products, for the map"))
    run.result.kept_products = keeper.line
    if load:
        run.result.vectors, run.result.metadata = db.reads.load(spec.name, representation, models=run.wanted)
    return run.result
