"""Reading a few byte ranges of a Hub file instead of downloading all of it.

A vector needs a few percent of each weight matrix's rows, which are contiguous row blocks of a safetensors file,
so a multi-GB shard need not come whole: :func:`fetch_safetensors_header` reads its header (the first 128 KiB,
:data:`HEADER_PROBE`, and the rest of the header if it is longer) and learns the file's size, and :func:`fetch_ranges`
writes the wanted byte ranges into a local (sparse) file at their own offsets, several requests in flight,
neighbouring ranges coalesced where the bytes between them cost less than one more request (:func:`gap_worth`).

Everything goes through huggingface_hub's public API (``hf_hub_url``, ``build_hf_headers``, ``get_session``,
``hf_raise_for_status``), so ``HF_ENDPOINT``, tokens, ``HF_HUB_OFFLINE`` and a client factory set by the user
(proxies, certificates) mean what they mean to any Hub user, as ``HfApi.get_safetensors_metadata`` reads its
headers. Nothing in an answer is trusted: each must be a 206 whose ``Content-Range`` is the range asked for, of a
file of the size the header fetch learnt, with a body of exactly that length; anything else (another range, a short
body, a dropped connection, 429, 5xx) is retried with the settings' backoff and, after the last try, is a one-line
:class:`~modelvec.core.errors.FetchError` (transient: the world failed, not the model). A server that ignores
``Range`` and answers 200 with the whole file is served correctly: that body is streamed whole into the local file
and no more ranges are asked for. A header that is no sound safetensors header (checked by the parser a local file's
header goes through, :mod:`modelvec.core.safetensors`) is the file's fault: a
:class:`~modelvec.core.errors.CheckpointError`.

A lying server that answers other bytes under the right headers cannot be caught here (huggingface_hub checks no
more for a range either): the caller checks what it reads (the tensors' values), or fetches the whole file.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx2
from huggingface_hub import get_session, hf_hub_url
from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled
from huggingface_hub.utils import build_hf_headers, hf_raise_for_status

from ..core.errors import BadRangeAnswer, CheckpointError, FetchError, ModelvecError, raise_if_resource, shown
from ..core.safetensors import MAX_HEADER, HeaderFault, check_length, parse_header
from ..core.spans import merge
from .client import HubSettings, describe_error, with_retries
from .download import check_repo_id, check_revision

__all__ = [
    "BadRangeAnswer",
    "RangeJob",
    "RangeStats",
    "RemoteFile",
    "SafetensorsHeader",
    "coalesce_ranges",
    "fetch_many",
    "fetch_ranges",
    "fetch_safetensors_header",
    "gap_worth",
]

#: Bytes asked for by the first request of a header: most safetensors headers are far smaller (a shard of an 8B
#: Llama: ~30 KB), so one request; and small beside what a small model's share of rows costs (3 shards of SmolLM2
#: at 1 MiB each were 1.4 % of its matrices' bytes).
HEADER_PROBE = 1 << 17
#: The most bytes one range request asks for (:func:`coalesce_ranges`): a long read is spread over the requests in
#: flight, and a request that fails repeats at most this much.
REQUEST_CAP = 16 << 20
#: Bytes per read of a body (bodies are streamed, never held whole).
CHUNK = 1 << 20
#: An error answer's body is read (for huggingface_hub's message) only if it announces at most this many bytes.
_ERROR_BODY_LIMIT = 1 << 20
_CONTENT_RANGE = re.compile(r"\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*", re.IGNORECASE)
_UNSATISFIED = re.compile(r"\s*bytes\s+\*/(\d+)\s*", re.IGNORECASE)


@dataclass(frozen=True)
class RemoteFile:
    """One file of a Hub repository that is read by ranges; ``size`` is its length in bytes, from the header
    fetch's ``Content-Range`` total (every range answer must name the same total). ``revision`` should be a commit
    sha, so that every range comes from the same bytes."""

    repo_id: str
    revision: str
    filename: str
    size: int


@dataclass(frozen=True)
class SafetensorsHeader:
    """The header of a remote safetensors file: ``raw`` is its first ``data_start`` bytes verbatim (the 8-byte length
    prefix and the JSON header, to write at offset 0 of the local file), ``header`` the parsed JSON (tensor name ->
    {dtype, shape, data_offsets}, and ``__metadata__`` if any); a tensor's bytes are at ``data_start + offset``."""

    file: RemoteFile
    raw: bytes
    header: dict[str, Any]
    data_start: int


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


# --------------------------------------------------------------------------------------------- HTTP


def _refuse_offline(repo_id: str, filename: str, hub_settings: HubSettings) -> None:
    if hub_settings.offline:
        raise FetchError(
            repo_id, f"{shown(filename)}: offline (HF_HUB_OFFLINE=1): byte ranges of a Hub file cannot be read"
        ) from OfflineModeIsEnabled("HF_HUB_OFFLINE=1")


def _url(file: RemoteFile, hub_settings: HubSettings) -> str:
    return hf_hub_url(file.repo_id, file.filename, revision=file.revision, endpoint=hub_settings.endpoint)


def _headers(hub_settings: HubSettings, start: int, stop: int) -> dict[str, str]:
    """The Hub's headers (token, user agent), one range ``[start, stop)``, and no compression (a range is of the
    file's own bytes)."""
    return {
        **build_hf_headers(token=hub_settings.token),
        "Accept-Encoding": "identity",
        "Range": f"bytes={start}-{stop - 1}",
    }


@contextmanager
def _get(url: str, headers: dict[str, str], hub_settings: HubSettings) -> Iterator[httpx2.Response]:
    """A streamed GET through huggingface_hub's shared client (redirects followed, as to the Hub's CDN); an error
    status raises huggingface_hub's own error (its body is read for the message only when it is small)."""
    with get_session().stream(
        "GET", url, headers=headers, timeout=hub_settings.timeout, follow_redirects=True
    ) as response:
        if response.status_code >= 400:
            try:
                small = int(response.headers.get("Content-Length", "")) <= _ERROR_BODY_LIMIT
            except ValueError:
                small = False
            if small:
                response.read()
            else:
                response.close()  # huggingface_hub then gives its message without the body
            hf_raise_for_status(response)
        if response.status_code not in (200, 206):
            raise BadRangeAnswer(f"HTTP {response.status_code} to a range request")
        encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            raise BadRangeAnswer(f"the answer is encoded ({shown(encoding, 40)}), not the file's own bytes")
        yield response


def _content_range(response: httpx2.Response) -> tuple[int, int, int | None]:
    """``[first, last]`` and the total of a 206's ``Content-Range`` (total None when ``*``)."""
    value = response.headers.get("Content-Range")
    m = _CONTENT_RANGE.fullmatch(value or "")
    if m is None:
        raise BadRangeAnswer(f"a 206 answer with Content-Range {shown(value, 60)}")
    first, last, total = m.groups()
    return int(first), int(last), None if total == "*" else int(total)


def _content_length(response: httpx2.Response) -> int | None:
    try:
        return int(response.headers["Content-Length"])
    except (KeyError, ValueError):
        return None


def _check_range(response: httpx2.Response, start: int, stop: int, size: int) -> None:
    """A 206 must say it carries exactly ``[start, stop)`` of a file of ``size`` bytes."""
    first, last, total = _content_range(response)
    if (first, last + 1, total) != (start, stop, size):
        raise BadRangeAnswer(
            f"asked for bytes {start}-{stop - 1} of {size}, the answer says it has bytes {first}-{last} of "
            f"{'an unknown size' if total is None else total}"
        )
    length = _content_length(response)
    if length is not None and length != stop - start:
        raise BadRangeAnswer(f"asked for {stop - start} bytes, the answer announces {length}")


def _read_until(response: httpx2.Response, need: Callable[[bytearray], int]) -> bytes:
    """Read a body until ``need(read so far)`` bytes are there (or it ends); the bytes read, possibly more."""
    buffer = bytearray()
    for chunk in response.iter_raw():
        buffer += chunk
        if len(buffer) >= need(buffer):
            break
    return bytes(buffer)


# --------------------------------------------------------------------------------------------- the header


def _header_need(buffer: bytearray | bytes) -> int:
    """How many bytes from the start of a safetensors file hold its header: 8, then 8 + the length they give
    (only 8 when that length is over safetensors' limit: refused, never read)."""
    if len(buffer) < 8:
        return 8
    length = int.from_bytes(buffer[:8], "little")
    return 8 if length > MAX_HEADER else 8 + length


def _read_first(url: str, hub_settings: HubSettings) -> tuple[bytes, int]:
    """The first bytes of the file (its first :data:`HEADER_PROBE` bytes, or to the header's end if the server sends
    the whole file) and the file's size."""
    try:
        return _read_first_answer(url, hub_settings)
    except HfHubHTTPError as exc:  # 416 to bytes=0-...: the file is empty; its size is in Content-Range
        m = _UNSATISFIED.fullmatch(exc.response.headers.get("Content-Range") or "")
        if exc.response.status_code == 416 and m is not None and int(m.group(1)) == 0:
            return b"", 0
        raise


def _read_first_answer(url: str, hub_settings: HubSettings) -> tuple[bytes, int]:
    with _get(url, _headers(hub_settings, 0, HEADER_PROBE), hub_settings) as response:
        if response.status_code == 200:  # Range ignored: read what the header needs and hang up
            announced = _content_length(response)
            if announced is None:
                raise BadRangeAnswer("the server ignored Range and did not say the file's size")
            size: int = announced
            data = _read_until(response, lambda got: min(_header_need(got), size))
            if len(data) < min(_header_need(data), size):
                raise BadRangeAnswer(f"the answer ended after {len(data)} of the file's {size} bytes")
            return data, size
        first, last, total = _content_range(response)
        if total is None or first != 0 or not (last == min(HEADER_PROBE, total) - 1):
            raise BadRangeAnswer(
                f"asked for bytes 0-{HEADER_PROBE - 1}, the answer says it has bytes {first}-{last} of {total}"
            )
        data = _read_until(response, lambda _: last + 1)
        if len(data) != last + 1:
            raise BadRangeAnswer(f"asked for {last + 1} bytes, the answer has {len(data)}")
        return data, total


def _read_span(url: str, hub_settings: HubSettings, start: int, stop: int, size: int) -> bytes:
    """Bytes ``[start, stop)`` of a file of ``size`` bytes, in memory (for a header: at most 100 MB)."""
    with _get(url, _headers(hub_settings, start, stop), hub_settings) as response:
        if response.status_code == 200:
            if _content_length(response) not in (None, size):
                raise BadRangeAnswer(f"the whole file announced {_content_length(response)} bytes, not {size}")
            data = _read_until(response, lambda _: stop)[start:stop]
        else:
            _check_range(response, start, stop, size)
            data = _read_until(response, lambda _: stop - start + 1)  # one more byte would be one too many
        if len(data) != stop - start:
            raise BadRangeAnswer(f"asked for bytes {start}-{stop - 1}, the answer has {len(data)} bytes")
        return data


def fetch_safetensors_header(
    repo_id: str, revision: str, filename: str, hub_settings: HubSettings
) -> SafetensorsHeader:
    """The header of a safetensors file on the Hub and the file's size, without downloading the file.

    One request for the first 128 KiB (and, for a longer header, one for the rest), each retried as the settings say;
    a server that ignores ``Range`` is read only as far as the header goes, then hung up on. A header that safetensors
    would refuse (over its 100 MB limit, not a JSON object of sound tensor entries, tensors that do not tile the file's
    data exactly) is a :class:`CheckpointError` (the file is bad), said in the words a local file's fault is said in
    (one parser: :func:`~modelvec.core.safetensors.parse_header`); failing to reach it is a :class:`FetchError`.
    """
    check_repo_id(repo_id)
    check_revision(repo_id, revision)
    _refuse_offline(repo_id, filename, hub_settings)
    url = hf_hub_url(repo_id, filename, revision=revision, endpoint=hub_settings.endpoint)
    what = f"{repo_id}/{filename}"
    try:
        data, total = with_retries(lambda: _read_first(url, hub_settings), hub_settings, what)
        length = int.from_bytes(data[:8], "little") if total >= 8 else 0
        check_length(total, length)
        if len(data) < 8 + length:
            start = len(data)
            rest = with_retries(lambda: _read_span(url, hub_settings, start, 8 + length, total), hub_settings, what)
            data += rest
        raw = data[: 8 + length]
        header = parse_header(raw[8:], total - 8 - length)
    except HeaderFault as fault:  # the file's fault, in the words a local file's would be said in
        raise CheckpointError(repo_id, f"{shown(filename)}: {fault}") from None
    except ModelvecError:
        raise
    except Exception as exc:
        raise_if_resource(exc, repo_id)
        raise FetchError(repo_id, f"{shown(filename)}: could not read its header: {_cause(exc)}") from exc
    return SafetensorsHeader(RemoteFile(repo_id, revision, filename, total), raw, header, 8 + length)


# --------------------------------------------------------------------------------------------- ranges


def gap_worth(bandwidth: float, request_seconds: float, in_flight: int) -> int:
    """The longest gap between two wanted ranges that is cheaper to download than to skip with one more request.

    A request costs ``request_seconds`` (a round trip to first byte, and the server's and client's work on it) but
    ``in_flight`` requests overlap theirs, so over a busy link each costs the transfer ``request_seconds /
    in_flight``; a gap of ``g`` bytes costs ``g / bandwidth``. So a gap is worth fetching while ``g <= bandwidth *
    request_seconds / in_flight`` (1 Gbit/s, 20 ms, 16 in flight: 156 kB)."""
    if bandwidth <= 0 or request_seconds < 0 or in_flight < 1:
        raise ValueError(f"no such link: {bandwidth} B/s, {request_seconds} s a request, {in_flight} in flight")
    return int(bandwidth * request_seconds / in_flight)


def coalesce_ranges(ranges: Sequence[tuple[int, int]], gap: int, cap: int | None = None) -> list[tuple[int, int]]:
    """The requests for byte ranges ``[start, stop)``: sorted, empty ones dropped, merged where they overlap or where
    the bytes between two are at most ``gap`` (see :func:`gap_worth`) and at most the length of either, then cut
    into requests of at most ``cap`` bytes. Every wanted byte is in exactly one request.

    The bound by the neighbours' lengths keeps what is fetched within twice what was asked for: each gap fetched is
    no longer than a range asked for, so the narrow rows of a small model's share are not fetched with every row
    between them (SmolLM2-135M's 5 % of rows: 5.6 % of its matrices' bytes, against 13.6 % under ``gap`` alone).
    The cap keeps a long read spread over the requests in flight (one connection is far from a link's
    bandwidth) and what one failed request repeats short; no merge makes a request longer than it."""
    if cap is not None and cap < 1:
        raise ValueError(f"a request must be allowed at least one byte, not {cap}")
    out: list[list[int]] = []
    for start, stop in merge(ranges):
        if (
            out
            and start - out[-1][1] <= min(gap, stop - start, out[-1][2])
            and (cap is None or stop - out[-1][0] <= cap)
        ):
            out[-1][1], out[-1][2] = stop, stop - start
        else:
            out.append([start, stop, stop - start])  # the last range asked for, as the bound for the next gap
    if cap is None:
        return [(a, b) for a, b, _ in out]
    return [(at, min(at + cap, b)) for a, b, _ in out for at in range(a, b, cap)]


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


def _pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


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
            _pwrite_all(self.fd, data, self.at)
            self.at += len(data)
            self.progress.count(nbytes=len(data))


def _write_whole(response: httpx2.Response, fd: int, file: RemoteFile, progress: _Progress) -> None:
    """A 200 answer to a range request carries the whole file: write all of it (one such answer at a time; a
    second one, while the first is written, hangs up and waits to see whether the first one succeeded)."""
    announced = _content_length(response)
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
    with _get(url, _headers(hub_settings, sink.at, sink.stop), hub_settings) as response:
        if response.status_code == 200:
            _write_whole(response, sink.fd, file, progress)
            return
        _check_range(response, sink.at, sink.stop, file.size)
        sink.drain(response)
        if sink.at < sink.stop:
            raise BadRangeAnswer(f"the answer ended {sink.stop - sink.at} bytes short of byte {sink.stop - 1}")


def _cause(exc: BaseException) -> str:
    """One line: why a request failed, and after how many tries."""
    if isinstance(exc, BadRangeAnswer):
        tries = getattr(exc, "modelvec_tries", 1)
        return f"bad answer to a range request{f' after {tries} tries' if tries > 1 else ''}: {shown(str(exc), 160)}"
    return describe_error(exc)


@dataclass(frozen=True)
class RangeJob:
    """The byte ranges ``[start, stop)`` of one remote file to write into the local file ``out`` at their offsets."""

    file: RemoteFile
    ranges: Sequence[tuple[int, int]]
    out: Path


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
            _refuse_offline(job.file.repo_id, job.file.filename, hub_settings)
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
    return coalesce_ranges(job.ranges, gap, cap)


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
        self.urls = [_url(job.file, hub_settings) for job in jobs]
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
                    file.repo_id, f"{shown(file.filename)}: could not read byte ranges: {_cause(exc)}"
                ) from exc


def _stats(progress: _Progress, started: float) -> RangeStats:
    return RangeStats(progress.requests, progress.bytes, time.monotonic() - started, progress.whole.is_set())
