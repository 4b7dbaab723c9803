"""The local engine: this machine, with I/O threads that fetch and prefetch the next models."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

from ..hub.client import HubSettings
from ..represent.representation import Representation
from .work import BaseSpec, Opened, Outcome, Task, compute, fit_base, open_counted, plan_of

if TYPE_CHECKING:
    from ..represent import DeltaEmbedder


def _prepare(task: Task, hub_settings: HubSettings, representation: Representation) -> Opened:
    """Off the compute thread: fetch (Hub: only what ``representation`` reads), read the headers, and start reading
    from disk the bytes the vector needs (by the read plan the fetch worked out and the checkpoint carries, or,
    where none did, worked out here: once a model)."""
    opened = open_counted(task, hub_settings, representation)
    ck = opened.checkpoint
    ck.layout()
    if representation.reads_share and not ck.factored and ck.reads is None:
        ck.plan_reads(plan_of(ck, representation, base=False))
    ck.prefetch()
    return opened


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

    @classmethod
    def from_options(cls, workers: int | None, device: str, address: str | None = None) -> LocalEngine:
        """The engine of ``--engine local``: 2 I/O threads unless told otherwise; no cluster address."""
        if address is not None:
            raise ValueError("--address is for --engine ray")
        return cls(2 if workers is None else workers, device)

    def run(
        self,
        base: BaseSpec,
        representation: Representation,
        tasks: Iterable[Task],
        hub_settings: HubSettings,
        keep_weights: bool = True,
    ) -> Iterator[Outcome]:
        """Outcomes in task order. The base is read when the first task arrives, while the next ones download."""
        embedder: DeltaEmbedder | None = None
        with _ReadAhead(tasks, self.workers, lambda task: _prepare(task, hub_settings, representation)) as ahead:
            for task, opened in ahead:
                if embedder is None:
                    embedder = fit_base(base, representation, self.device, hub_settings)
                outcome = compute(task, embedder, opened.result, hub_settings)
                if not keep_weights:
                    task.release(hub_settings)
                yield outcome


class _ReadAhead:
    """Tasks in order, each with its files being opened by one of ``workers`` threads: while one task is computed,
    the next ``workers`` are already fetching. Closing it cancels what was not started."""

    def __init__(self, tasks: Iterable[Task], workers: int, prepare: Callable[[Task], Opened]) -> None:
        self.todo, self.workers, self.prepare = iter(tasks), workers, prepare
        self.pending: deque[tuple[Task, Future[Opened]]] = deque()
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="modelvec-io")

    def __enter__(self) -> _ReadAhead:
        return self

    def __exit__(self, *exc: object) -> None:
        for _, opened in self.pending:
            opened.cancel()
        self.pool.shutdown(wait=True, cancel_futures=True)

    def __iter__(self) -> Iterator[tuple[Task, Future[Opened]]]:
        self._fill()
        while self.pending:
            task, opened = self.pending.popleft()
            self._fill()
            yield task, opened

    def _fill(self) -> None:
        while len(self.pending) < self.workers:
            task = next(self.todo, None)
            if task is None:
                return
            self.pending.append((task, self.pool.submit(self.prepare, task)))
