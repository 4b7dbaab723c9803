"""The held blocks of a pass of nearest lists (:mod:`modelvec.store.derived.neighbours`) as Ray tasks, for ``cluster
--engine ray``: the part of the analysis that grows as n^2 spread over the machines of a cluster.

Each task is one held block of the pass against every vector after it
(:func:`~modelvec.store.derived.neighbours.run_task`): a worker opens the store's vector file at the driver's path (a
shared file system: every node must see the store's files at the same path), computes those products in the blocks the
local pass uses, and returns its part of every model's lists; the driver merges them (the nearest of the union is the
nearest of each part's), so the lists, and every score from them, are the local pass's. A task takes one CPU. A worker
that dies (killed, out of memory, its node lost) has its task run again elsewhere (Ray's retries of a task whose worker
died): nothing of it was kept, nothing is lost. Tasks are submitted as workers have room, so the driver holds at most a
few parts at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import numpy as np

from ..analyse.graph import Lists
from ..store.derived.neighbours import Task, TaskRunner, run_task
from .ray_actors import one_line
from .ray_engine import connected

try:
    import ray
except ImportError:  # the optional extra is not installed: ray_runner says so
    ray = None  # type: ignore[assignment]

#: Times a task whose worker died is run again (Ray's ``max_retries``).
RETRIES = 3
Part = tuple[dict[str, Lists], dict[str, str], np.ndarray]


def ray_runner(
    address: str | None = None, workers: int | None = None, fn: Callable[[Task], Part] = run_task
) -> TaskRunner:
    """A :data:`~modelvec.store.derived.neighbours.TaskRunner` on the Ray cluster at ``address`` (None: one on this
    machine, or a local one for the pass): at most ``workers`` tasks at once (default: one per CPU of the cluster).
    ``fn``: what each task runs (:func:`~modelvec.store.derived.neighbours.run_task`)."""

    def run(tasks: Sequence[Task]) -> Iterator[Part]:
        with connected(address):
            remote = ray.remote(num_cpus=1, max_retries=RETRIES)(fn)
            room = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
            pending: list[ray.ObjectRef] = []
            todo = list(tasks)
            while todo or pending:
                while todo and len(pending) < room:
                    pending.append(remote.remote(todo.pop(0)))
                done, pending = ray.wait(pending, num_returns=1)
                try:
                    yield ray.get(done[0])
                except Exception as exc:  # the task's own error, after its retries: the pass cannot finish
                    raise ValueError(
                        f"a block of the nearest lists failed on the Ray cluster: {one_line(exc)}"
                    ) from None

    return run
