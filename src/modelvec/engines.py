"""Engines: where the per-model work runs, on this machine in threads or on a Ray cluster.

The driver (:mod:`modelvec.pipeline`) decides what needs computing and writes the store; an
engine takes a stream of :class:`Task` (one model each, small and picklable) and yields one
:class:`Outcome` per task (a vector, or the one-line reason it failed). Both engines run the same
:func:`compute`, so a vector does not depend on where it was computed.
"""

from __future__ import annotations

import time
import warnings
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

import numpy as np

from .cards import card_author, card_datasets, read_card
from .checkpoint import Checkpoint, open_checkpoint
from .download import FetchError, fetch, release
from .errors import ModelvecError
from .hub import HubSettings
from .representation import DeltaEmbedder, Representation


@dataclass(frozen=True)
class BaseSpec:
    """How any worker opens the base: a local path, or a Hub repo pinned to a sha."""

    name: str
    identity: str
    path: str | None = None
    repo: str | None = None
    sha: str | None = None

    def open(self, settings: HubSettings) -> Checkpoint:
        if self.path is not None:
            return Checkpoint(self.path, name=self.name)
        return Checkpoint(fetch(str(self.repo), str(self.sha), None, settings), name=self.name)


@dataclass(frozen=True)
class Task:
    """One model to embed: its store name and identity, where its files are, and known labels."""

    name: str
    identity: str
    source: str
    path: str | None = None
    repo: str | None = None  # a Hub model, fetched at ``sha``
    sha: str | None = None
    files: tuple[str, ...] = ()
    datasets: tuple[str, ...] | None = None  # None: read them from the model card
    label_source: str | None = None
    author: str | None = None

    def open(self, settings: HubSettings) -> Checkpoint:
        """The model's checkpoint, fetched first when it lives on the Hub."""
        if self.repo is not None:
            return open_checkpoint(fetch(self.repo, str(self.sha), list(self.files) or None, settings), name=self.name)
        return open_checkpoint(str(self.path), name=self.name)

    def labels(self, ck: Checkpoint) -> tuple[list[str], str | None, str | None]:
        if self.datasets is not None:
            return list(self.datasets), self.label_source, self.author
        card = read_card(ck.folder)
        datasets = card_datasets(card)
        return datasets, "card" if datasets else None, card_author(card)

    def release(self, settings: HubSettings) -> None:
        """Delete a Hub model's fetched files (a local model is left alone); a failure to delete only warns."""
        if self.repo is not None:
            try:
                release(self.repo, str(self.sha), settings)
            except OSError as exc:
                warnings.warn(f"{self.name}: could not delete its cached files: {exc}", stacklevel=2)


@dataclass
class Outcome:
    """What became of one task: a vector, or the reason it failed.

    ``content`` marks a failure of the weights themselves (kept with the model's identity, so the
    same files are not fetched again); other failures (network, access) are retried next run.
    """

    task: Task
    vector: np.ndarray | None = None
    architecture: str | None = None
    datasets: list[str] = field(default_factory=list)
    label_source: str | None = None
    author: str | None = None
    seconds: float = 0.0
    error: str | None = None
    content: bool = False


def fit_base(base: BaseSpec, params: Representation, device: str, settings: HubSettings) -> DeltaEmbedder:
    """The embedder with the base's matrices read (once per engine worker)."""
    return DeltaEmbedder.from_params(params, device).fit(base.open(settings))


def compute(task: Task, embedder: DeltaEmbedder, checkpoint: Callable[[], Checkpoint]) -> Outcome:
    """Embed one model. The model's own faults become the outcome's error; a fault of the base raises."""
    start = time.perf_counter()
    try:
        ck = checkpoint()
        try:
            vector = embedder.embed_one(ck)
            datasets, label_source, author = task.labels(ck)
        finally:
            ck.close()
    except ModelvecError as exc:
        if exc.model == embedder.base_.name:  # the base itself is broken: nothing can be embedded
            raise
        return Outcome(task, error=str(exc), content=not isinstance(exc, FetchError),
                       seconds=time.perf_counter() - start)
    except Exception as exc:  # a run over many models goes on; the reason is kept
        return Outcome(task, error=f"{task.name}: {type(exc).__name__}: {exc}".splitlines()[0], content=True,
                       seconds=time.perf_counter() - start)
    return Outcome(task, vector, embedder.layout_.arch.name, datasets, label_source, author,
                   time.perf_counter() - start)


def _prepare(task: Task, settings: HubSettings) -> Checkpoint:
    """Off the compute thread: fetch (Hub), read the headers, and start reading the weights from disk."""
    ck = task.open(settings)
    ck.layout()
    ck.prefetch()
    return ck


class LocalEngine:
    """This machine: ``workers`` I/O threads fetch and prefetch the models queued behind the one computed.

    The computation runs in the calling thread (torch uses every core for it). At most
    ``workers + 1`` models are open at once, each memory-mapped rather than read into memory,
    so memory stays flat however many models a run has; with ``keep_weights=False`` a Hub
    model's files are deleted once it is embedded, so disk stays flat too.
    """

    def __init__(self, workers: int = 2, device: str = "cpu") -> None:
        if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
            raise ValueError(f"workers must be an integer >= 1, not {workers!r}")
        self.workers = workers
        self.device = device

    def run(self, base: BaseSpec, params: Representation, tasks: Iterable[Task], settings: HubSettings,
            keep_weights: bool = True) -> Iterator[Outcome]:
        """Outcomes in task order. The base is read when the first task arrives, while the next ones download."""
        todo = iter(tasks)
        pending: deque[tuple[Task, Future[Checkpoint]]] = deque()
        embedder: DeltaEmbedder | None = None
        pool = ThreadPoolExecutor(self.workers, thread_name_prefix="modelvec-io")

        def fill() -> None:
            while len(pending) < self.workers:
                task = next(todo, None)
                if task is None:
                    return
                pending.append((task, pool.submit(_prepare, task, settings)))

        try:
            fill()
            while pending:
                task, opened = pending.popleft()
                fill()
                if embedder is None:
                    embedder = fit_base(base, params, self.device, settings)
                outcome = compute(task, embedder, opened.result)
                if not keep_weights:
                    task.release(settings)
                yield outcome
        finally:
            for _, opened in pending:
                opened.cancel()
            pool.shutdown(wait=True, cancel_futures=True)


def make_engine(engine: str, workers: int | None, device: str, address: str | None = None) -> "LocalEngine":
    """The engine named on the command line: ``local`` (threads) or ``ray`` (a Ray cluster)."""
    if engine == "local":
        if address is not None:
            raise ValueError("--address is for --engine ray")
        return LocalEngine(2 if workers is None else workers, device)
    if engine == "ray":
        from .ray_engine import RayEngine

        return RayEngine(workers, device, address)  # type: ignore[return-value]
    raise ValueError(f"engine must be local or ray, not {engine!r}")
