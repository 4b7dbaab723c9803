"""Row blocks on every core the process may use.

numpy's and scipy's element-wise loops, sorts and partitions release the GIL, so threads over row blocks of
distances scale with the cores (where BLAS alone would leave the element-wise work on one). Results come back in
the blocks' order, at most a few blocks ahead of the consumer, so memory stays a few blocks whatever the cores.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from typing import TypeVar

from ..core.machine import cores

T = TypeVar("T")
R = TypeVar("R")


def in_order(fn: Callable[[T], R], items: Iterable[T], threads: int | None = None) -> Iterator[R]:
    """``fn(item)`` for each item, run on up to ``threads`` threads (default: :func:`cores`), yielded in the items'
    order; at most ``threads`` results wait ahead of the consumer."""
    threads = cores() if threads is None else max(1, threads)
    work = list(items)
    if threads == 1 or len(work) <= 1:
        yield from map(fn, work)
        return
    with ThreadPoolExecutor(min(threads, len(work)), thread_name_prefix="modelvec-rows") as pool:
        ahead: deque[Future[R]] = deque()
        for item in work:
            ahead.append(pool.submit(fn, item))
            if len(ahead) > threads:
                yield ahead.popleft().result()
        while ahead:
            yield ahead.popleft().result()


def each(fn: Callable[[T], object], items: Iterable[T], threads: int | None = None) -> None:
    """``fn(item)`` for each item on up to ``threads`` threads, for its effect (writing disjoint parts of an array)."""
    for _ in in_order(fn, items, threads):
        pass


def one_blas_thread() -> AbstractContextManager[object]:
    """BLAS held to one thread in every BLAS library the analysis uses (numpy's and scipy's, which is loaded
    first: threadpoolctl limits only the libraries loaded when it is asked). The analysis after the products is
    small LAPACK calls and row blocks on threads of their own, where OpenBLAS's threads only wait on each other:
    a randomized SVD of a 2,048 x 2,048 matrix took 1.5-2.7 s with two, 0.19 s with one."""
    import scipy.linalg  # noqa: F401  (its OpenBLAS, loaded now so that the limit reaches it)
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1, user_api="blas")
