"""Reading a few byte ranges of a Hub file instead of downloading all of it.

A vector needs a few percent of each weight matrix's rows, which are contiguous row blocks of a safetensors file,
so a multi-GB shard need not come whole: once its header is known (:mod:`.remote_header`), :func:`fetch_ranges`
writes the wanted byte ranges into a local (sparse) file at their own offsets, several requests in flight,
neighbouring ranges coalesced where the bytes between them cost less than one more request (:func:`gap_worth`).

Each answer is checked (:mod:`.answers`); a bad one (another range, a short body, a dropped connection, 429, 5xx) is
retried with the settings' backoff and, after the last try, is a one-line :class:`~modelvec.core.errors.FetchError`
(transient: the world failed, not the model). A server that ignores ``Range`` and answers 200 with the whole file is
served correctly: that body is streamed whole into the local file and no more ranges are asked for.

A lying server that answers other bytes under the right headers cannot be caught here (huggingface_hub checks no
more for a range either): the caller checks what it reads (the tensors' values), or fetches the whole file.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from ..core.errors import BadRangeAnswer, FetchError, raise_if_resource, shown
from ..core.files import pwrite_all
from ..core.spans import merge
from .answers import (
    RemoteFile,
    cause_of,
    check_range,
    content_length,
    range_headers,
    refuse_offline,
    stream_get,
    url_of,
)
from .client import HubSettings, with_retries
from .http import httpx2

__all__ = [
    "BadRangeAnswer",
    "RangeJob",
    "RangeStats",
    "RemoteFile",
    "coalesce_ranges",
    "fetch_many",
    "fetch_ranges",
    "gap_worth",
]

#: The most bytes one range request asks for (:func:`coalesce_ranges`): a long read is spread over the requests in
#: flight, and a request that fails repeats at most this much.
REQUEST_CAP = 16 << 20
#: Bytes per read of a body (bodies are streamed, never held whole).
CHUNK = 1 << 20


@dataclass(frozen=True)
class RangeStats:
    """What :func:`fetch_ranges` did: HTTP requests sent (retries included), body bytes received and written,
    seconds taken, and whether the server ignored ``Range`` and sent the whole file (the caller says so once)."""

    requests: int
    bytes: int
    seconds: float
    whole_file: bool


class _Cancelled(Exception):
    """Another range of the same call failed for good: this one stops (not retried)."""


def gap_worth(bandwidth: float, request_seconds: float, in_flight: int) -> int:
    """The longest gap between two wanted ranges that is cheaper to download than to skip with one more request.

    A request costs ``request_seconds`` (a round trip to first byte, and the server's and client's work on it) but
    ``in_flight`` requests overlap theirs, so over a busy link each costs the transfer ``request_seconds /
    in_flight``; a gap of ``g`` bytes costs ``g / bandwidth``. So a gap is worth fetching while ``g <= bandwidth *
    request_seconds / in_flight`` (1 Gbit/s, 20 ms, 16 in flight: 156 kB)."""
    if bandwidth <= 0 or request_seconds < 0 or in_flight < 1:
        raise ValueError(f"no such link: {bandwidth} B/s, {request_seconds} s a request, {in_flight} in flight")
    return int(bandwidth * request_seconds / in_flight)


def coalesce_ranges(
    ranges: Sequence[tuple[int, int]], gap: int, cap: int | None = None, ceiling: int | None = None
) -> list[tuple[int, int]]:
    """The requests for byte ranges ``[start, stop)``: sorted, empty ones dropped, merged where they overlap or where
    the bytes between two are at most ``gap`` (see :func:`gap_worth`) and at most the length of either, then cut
    into requests of at most ``cap`` bytes. Every wanted byte is in exactly one request.

    The bound by the neighbours' lengths keeps what is fetched within twice what was asked for: each gap fetched is
    no longer than a range asked for, so the narrow rows of a small model's share are not fetched with every row
    between them (SmolLM2-135M's 5 % of rows: 5.6 % of its matrices' bytes, against 13.6 % under ``gap`` alone).
    ``ceiling``: at most this many bytes in all, the largest of those gaps left out until the rest fit (wanted bytes
    beyond it are all fetched, with no gap). The cap keeps a long read spread over the requests in flight (one connection is far
    from a link's bandwidth) and what one failed request repeats short; no merge makes a request longer than it."""
    if cap is not None and cap < 1:
        raise ValueError(f"a request must be allowed at least one byte, not {cap}")
    spans = merge(ranges)
    joined = _joined(spans, gap, cap)
    if ceiling is not None:
        by_size = sorted(joined, key=lambda i: (spans[i + 1][0] - spans[i][1], i))
        over = sum(b - a for a, b in spans) + sum(spans[i + 1][0] - spans[i][1] for i in by_size) - ceiling
        while by_size and over > 0:
            i = by_size.pop()
            joined.discard(i)
            over -= spans[i + 1][0] - spans[i][1]
    out: list[list[int]] = []
    for i, (start, stop) in enumerate(spans):
        if i - 1 in joined:
            out[-1][1] = stop
        else:
            out.append([start, stop])
    if cap is None:
        return [(a, b) for a, b in out]
    return [(at, min(at + cap, b)) for a, b in out for at in range(a, b, cap)]


def _joined(spans: Sequence[tuple[int, int]], gap: int, cap: int | None) -> set[int]:
    """Which gaps between sorted disjoint ``spans`` are fetched (``i``: the gap after span ``i``), by
    :func:`coalesce_ranges`' rule; leaving some out only shortens requests, so the cap still holds."""
    joined: set[int] = set()
    first, last = 0, 0  # the current request's start, and the length of the last range asked for in it
    for i, (start, stop) in enumerate(spans):
        if i and start - spans[i - 1][1] <= min(gap, stop - start, last) and (cap is None or stop - first <= cap):
            joined.add(i - 1)
        else:
            first = start
        last = stop - start
    return joined


class _Progress:
    """What the requests of one file share: counts, the whole file once one answer brought it, and the call's stop
    signal, set once one range (of any file of the call) failed for good."""

    def __init__(self, failed: threading.Event) -> None:
        self.lock = threading.Lock()
        self.requests = 0
        self.bytes = 0
        self.whole = threading.Event()  # the whole file is written: every range is satisfied
        self.whole_lock = threading.Lock()  # held while one answer's whole file is being written
        self.failed = failed

    def count(self, requests: int = 0, nbytes: int = 0) -> None:
        with self.lock:
            self.requests += requests
            self.bytes += nbytes


class _Sink:
    """Where bodies land in the local file: ``at`` is the next offset to write (never past ``stop``), and it moves
    with each write, so a retry after a broken connection asks only for the rest."""

    def __init__(self, fd: int, at: int, stop: int, progress: _Progress) -> None:
        self.fd = fd
        self.at = at
        self.stop = stop
        self.progress = progress
        self.buffer = bytearray()

    def drain(self, response: httpx2.Response) -> None:
        """Write a body in writes of about CHUNK bytes; what arrived before the connection broke is written too."""
        try:
            for chunk in response.iter_raw():
                if self.progress.failed.is_set():
                    raise _Cancelled()
                if self.at + len(self.buffer) + len(chunk) > self.stop:
                    raise BadRangeAnswer(f"the answer goes on past byte {self.stop - 1}")
                self.buffer += chunk
                if len(self.buffer) >= CHUNK:
                    self.flush()
        finally:
            self.flush()

    def flush(self) -> None:
        """The buffer is emptied before it is written: a write that fails is not tried again."""
        if self.buffer:
            data = bytes(self.buffer)
            self.buffer.clear()
            pwrite_all(self.fd, data, self.at)
            self.at += len(data)
            self.progress.count(nbytes=len(data))


def _write_whole(response: httpx2.Response, fd: int, file: RemoteFile, progress: _Progress) -> None:
    """A 200 answer to a range request carries the whole file: write all of it (one such answer at a time; a
    second one, while the first is written, hangs up and waits to see whether the first one succeeded)."""
    announced = content_length(response)
    if announced is not None and announced != file.size:
        raise BadRangeAnswer(f"the server sent the whole file of {announced} bytes, not of {file.size}")
    if not progress.whole_lock.acquire(blocking=False):
        response.close()
        with progress.whole_lock:
            pass
        if progress.whole.is_set():
            return
        raise BadRangeAnswer("the server ignored Range and the whole file it sent broke off")
    try:
        if progress.whole.is_set():
            return
        sink = _Sink(fd, 0, file.size, progress)
        sink.drain(response)
        if sink.at != file.size:
            raise BadRangeAnswer(f"the whole file the server sent ended after {sink.at} of {file.size} bytes")
        progress.whole.set()
    finally:
        progress.whole_lock.release()


def _fetch_span(
    url: str, fd: int, file: RemoteFile, start: int, stop: int, hub_settings: HubSettings, progress: _Progress
) -> None:
    """Bytes ``[start, stop)`` written at their offsets; one sink for all tries, so a retry asks only for what is
    still missing."""
    sink = _Sink(fd, start, stop, progress)
    with_retries(partial(_attempt, url, file, hub_settings, sink), hub_settings, f"{file.repo_id}/{file.filename}")


def _attempt(url: str, file: RemoteFile, hub_settings: HubSettings, sink: _Sink) -> None:
    """One request for the bytes of a span not yet written, ``[sink.at, sink.stop)``."""
    progress = sink.progress
    if progress.whole.is_set():
        return
    if progress.failed.is_set():
        raise _Cancelled()
    progress.count(requests=1)
    with stream_get(url, range_headers(hub_settings, sink.at, sink.stop), hub_settings) as response:
        if response.status_code == 200:
            _write_whole(response, sink.fd, file, progress)
            return
        check_range(response, sink.at, sink.stop, file.size)
        sink.drain(response)
        if sink.at < sink.stop:
            raise BadRangeAnswer(f"the answer ended {sink.stop - sink.at} bytes short of byte {sink.stop - 1}")


@dataclass(frozen=True)
class RangeJob:
    """The byte ranges ``[start, stop)`` of one remote file to write into the local file ``out`` at their offsets;
    ``ceiling``: the most bytes its requests may fetch, gaps between ranges included (:func:`coalesce_ranges`)."""

    file: RemoteFile
    ranges: Sequence[tuple[int, int]]
    out: Path
    ceiling: int | None = None


def fetch_ranges(
    file: RemoteFile,
    ranges: Sequence[tuple[int, int]],
    out: Path,
    hub_settings: HubSettings,
    *,
    max_in_flight: int = 8,
    gap: int = 256 << 10,
    cap: int | None = REQUEST_CAP,
) -> RangeStats:
    """Write each byte range ``[start, stop)`` of the remote ``file`` into the local file ``out`` at the same offset.

    ``out`` is expected pre-sized (sparse: only the ranges take disk); it is created and sized to ``file.size`` if
    missing. Ranges are sorted and those at most ``gap`` bytes apart fetched by one request of at most ``cap`` bytes
    (:func:`coalesce_ranges`; one range a request, never a multi-range one, which servers and CDNs answer in many
    ways), ``max_in_flight`` requests at once (one connection is far from a link's bandwidth), each body streamed
    to disk. Each answer is checked (see the module);
    a bad one is retried, resuming after the bytes already written, and after the last try a :class:`FetchError`
    naming the repository, the file and the cause stops the whole call. A server that answers 200 (it ignores
    ``Range``) sends the whole file: it is written whole, the other ranges are then not asked for, and the stats say
    ``whole_file``.
    """
    return fetch_many([RangeJob(file, ranges, out)], hub_settings, max_in_flight=max_in_flight, gap=gap, cap=cap)[0]


def fetch_many(
    jobs: Sequence[RangeJob],
    hub_settings: HubSettings,
    *,
    max_in_flight: int = 8,
    gap: int = 256 << 10,
    cap: int | None = REQUEST_CAP,
    on_done: Callable[[int, RangeStats], None] | None = None,
) -> list[RangeStats]:
    """:func:`fetch_ranges` for several files at once: their requests share one pool of ``max_in_flight``, so the
    link stays busy from one file to the next (a sharded checkpoint's shards one after the other would wait for each
    shard's last range). ``on_done(i, stats)`` is called, from the thread that fetched its last range, as soon as job
    ``i`` is complete (e.g. to record what is held before the other files are done). The first range that fails for
    good stops every job: a :class:`FetchError` naming its file."""
    started = time.monotonic()
    plans = [_plan(job, gap, cap) for job in jobs]
    for job, spans in zip(jobs, plans):
        if spans:
            refuse_offline(job.file.repo_id, job.file.filename, hub_settings)
    batch = _Batch(jobs, plans, hub_settings, on_done, started)
    work: list[tuple[int, int, int, int]] = []  # (job, its local file, start, stop) per request
    fds: list[int] = []
    try:
        for i, (job, spans) in enumerate(zip(jobs, plans)):
            if not spans:
                batch.report(i)
                continue
            fd = os.open(job.out, os.O_RDWR | os.O_CREAT, 0o644)
            fds.append(fd)
            if os.fstat(fd).st_size < job.file.size:
                os.ftruncate(fd, job.file.size)
            work += [(i, fd, start, stop) for start, stop in spans]
        batch.run(work, max_in_flight)
    finally:
        for fd in fds:
            os.close(fd)
    return [_stats(p, started) for p in batch.progress]


def _plan(job: RangeJob, gap: int, cap: int | None) -> list[tuple[int, int]]:
    """The requests of one job: its ranges, each checked to lie inside the file, coalesced."""
    for start, stop in job.ranges:
        if not 0 <= start <= stop <= job.file.size:
            raise ValueError(f"range [{start}, {stop}) is not inside {job.file.filename} ({job.file.size} bytes)")
    return coalesce_ranges(job.ranges, gap, cap, job.ceiling)


class _Batch:
    """What the worker threads of one :func:`fetch_many` call share: each job's URL and progress, how many of its
    spans are left (so the thread that fetches the last one reports the job done), and the stop signal of all."""

    def __init__(
        self,
        jobs: Sequence[RangeJob],
        plans: Sequence[Sequence[tuple[int, int]]],
        hub_settings: HubSettings,
        on_done: Callable[[int, RangeStats], None] | None,
        started: float,
    ) -> None:
        self.jobs = jobs
        self.hub_settings = hub_settings
        self.on_done = on_done
        self.started = started
        self.stopped = threading.Event()  # one range failed for good: every job's requests stop
        self.progress = [_Progress(self.stopped) for _ in jobs]
        self.urls = [url_of(job.file, hub_settings) for job in jobs]
        self.left = [len(spans) for spans in plans]
        self.left_lock = threading.Lock()

    def report(self, i: int) -> None:
        """Job ``i`` is complete: ``on_done`` hears so at once, before the other jobs are done."""
        if self.on_done is not None:
            self.on_done(i, _stats(self.progress[i], self.started))

    def fetch(self, i: int, fd: int, start: int, stop: int) -> None:
        """One span of job ``i``, from a worker thread; the job is reported when its last span is written."""
        _fetch_span(self.urls[i], fd, self.jobs[i].file, start, stop, self.hub_settings, self.progress[i])
        with self.left_lock:
            self.left[i] -= 1
            finished = self.left[i] == 0
        if finished:
            self.report(i)

    def run(self, work: Sequence[tuple[int, int, int, int]], max_in_flight: int) -> None:
        """Every span of ``work`` through one pool; the first that fails for good stops the others and is raised
        as a :class:`FetchError` naming its file."""
        with ThreadPoolExecutor(max_workers=max(1, min(max_in_flight, len(work))), thread_name_prefix="ranges") as pool:
            futures = [(i, pool.submit(self.fetch, i, fd, start, stop)) for i, fd, start, stop in work]
            try:
                done, _ = wait([f for _, f in futures], return_when=FIRST_EXCEPTION)
            except BaseException:  # interrupted: the requests in flight stop at their next chunk
                self.stopped.set()
                raise
            failed = next(((i, f) for i, f in futures if f in done and f.exception() is not None), None)
            if failed is not None:
                self.stopped.set()
                for _, future in futures:
                    future.cancel()
                wait([f for _, f in futures])
                i, future = failed
                exc = future.exception()
                assert exc is not None
                file = self.jobs[i].file
                raise_if_resource(exc, file.repo_id)  # the disk is full: the machine's fault, not the Hub's
                raise FetchError(
                    file.repo_id, f"{shown(file.filename)}: could not read byte ranges: {cause_of(exc)}"
                ) from exc


def _stats(progress: _Progress, started: float) -> RangeStats:
    return RangeStats(progress.requests, progress.bytes, time.monotonic() - started, progress.whole.is_set())
