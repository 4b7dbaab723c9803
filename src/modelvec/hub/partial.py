"""A Hub model read by byte ranges: a local folder that holds only what its vector needs.

When a representation reads a share of each matrix's rows, a fine-tune's multi-GB safetensors shards need not
come whole. :func:`open_partial` makes a folder that stands for the model at a commit (a :class:`PartialFolder`):
``config.json`` and the shard index downloaded whole (small, through the huggingface_hub cache), and each weight file
as a *sparse* file of its real size holding only its header (fetched by a range request:
:func:`~modelvec.hub.remote_header.fetch_safetensors_header`). The reader opens it as any checkpoint and says which
byte ranges the vector needs; :meth:`PartialFolder.fill` fetches those (and only those not already there) into the
sparse files at their own offsets. A marker file (:mod:`modelvec.core.partial`) lists the byte ranges each file
holds, so the reader refuses to read anything else (a hole reads as zeros), and a later run with other rows fetches
only what it lacks.

The folder lives in the repository's folder of the huggingface_hub cache (``<repo>/.modelvec/partial/<sha>``,
beside huggingface_hub's own ``snapshots``), pinned to the commit sha, and is deleted by :func:`release_partial`
(``--no-keep-weights``, under its lock, with its lock file) as a snapshot is. Safetensors and GGUF can be read so
(a GGUF repository: the finest of its quantizations, :func:`~modelvec.core.gguf.gguf_weights`; its header is its
metadata and tensor table): a pickled ``.bin`` has no byte layout to read it by, and a LoRA adapter is small;
:func:`open_partial` returns None for those and the caller downloads them whole.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading

import xxhash

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: threads are still ordered
    fcntl = None  # type: ignore[assignment]
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from ..core.errors import CheckpointError, FetchError, shown
from ..core.files import CONFIG, PARTIAL, QUANT_CONFIGS, SAFETENSORS, SAFETENSORS_INDEX, weight_format
from ..core.gguf import gguf_weights, split_parts
from ..core.partial import Marker, MarkerFault, Spans, marker_text, read_marker, span_key
from ..core.quantized import file_states
from ..core.spans import merge, missing
from .answers import RemoteFile
from .cache import repo_folder, write_atomic
from .client import HubSettings
from .download import download_file, list_files, pin
from .ids import is_commit_sha
from .names import check_filename, check_repo_id, check_revision, shard_names
from .ranges import REQUEST_CAP, RangeJob, RangeStats, coalesce_ranges, fetch_many, gap_worth
from .remote_header import GGUFHeader, SafetensorsHeader, fetch_gguf_header, fetch_safetensors_header

_LOCK = threading.Lock()  # guards _LOCKS
_LOCKS: dict[Path, threading.Lock] = {}  # per folder: one process's threads fill one folder's marker in turn

#: Requests in flight for one model's files (a stream has several models in flight: ``embed``'s I/O workers). Beyond
#: about 16 the local Hub's stream of 8B fine-tunes at 1 Gbit/s and 20 ms got no faster, and cost more CPU
#: (docs/scale.md, "Fetching at the link's floor"); huggingface_hub's client keeps 20 connections alive.
IN_FLIGHT = 16
#: Ranges this close are fetched by one request (:func:`~modelvec.hub.ranges.gap_worth`): at the link assumed,
#: 1 Gbit/s with 20 ms a request, a gap of 156 kB costs what a request costs with 16 in flight. Gaps are fetched
#: only where no longer than the ranges beside them, so the share of bytes stays near the share of rows.
GAP = gap_worth(125e6, 0.02, IN_FLIGHT)
#: The most bytes one request asks for.
CAP = REQUEST_CAP
#: The most of a file a partial download fetches where its ranges ask for less: gaps between them fetched, smallest
#: first, only within it (SmolLM2-135M's Q4_0 GGUF: 9.1 % asked, 10.7 % fetched without it); more asked: every gap.
SHARE = 0.1
#: How many times a file's own length its ranges' requests may cost before the gaps between them are fetched too
#: (:func:`_requested`): a bitsandbytes model of 6 MB read at 5 % of its rows costs 3 times, a GPTQ's 250 times.
WHOLE = 16


@dataclass
class Fetched:
    """What :meth:`PartialFolder.fill` fetched: bytes over the network, requests, and the files a server sent whole."""

    bytes: int = 0
    requests: int = 0
    whole_files: tuple[str, ...] = ()


def partial_folder(repo_id: str, revision: str, hub_settings: HubSettings) -> Path:
    """Where the partial download of ``repo_id`` at commit ``revision`` lives (inside its cache folder)."""
    return repo_folder(repo_id, hub_settings) / ".modelvec" / "partial" / revision


class PartialFolder:
    """One partial download: its folder (``path``), its lock, its marker (the byte ranges each file holds, each with
    its checksum), and its release. Every change to the folder or its marker is made under its lock.

    ``headers`` are the weight files' headers this process fetched (and parsed) to make the folder, by file name:
    the reader takes them as they are rather than parse the bytes it was just given again (empty where the folder
    was made before)."""

    def __init__(self, path: Path, repo_id: str, revision: str) -> None:
        self.path = path
        self.repo_id = repo_id
        self.revision = revision
        self.headers: dict[str, SafetensorsHeader] = {}

    @property
    def lock_path(self) -> Path:
        """The lock file beside the folder (not in it: the folder is made and deleted under it)."""
        return self.path.parent / f"{self.path.name}.lock"

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """The folder's marker and files to this thread alone, across processes too (Ray workers, two runs): a folder
        made twice at once would truncate the other's fetched bytes, and a marker written from a stale read would
        drop ranges the other fetched."""
        with _LOCK:
            lock = _LOCKS.setdefault(self.path, threading.Lock())
        with lock, self._lock_file():
            yield

    def _lock_file(self) -> BinaryIO:
        """The lock file, open and locked; taken again where a release deleted the one locked meanwhile (a waiter
        that locked the deleted file would share the folder with whoever made a new one)."""
        while True:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            try:
                handle = open(self.lock_path, "a+b")  # noqa: SIM115 - closed by the caller's with
            except FileNotFoundError:  # its folder was removed by a release in between
                continue
            if fcntl is None:
                return handle
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                mine, now = os.fstat(handle.fileno()), os.stat(self.lock_path)
                if (mine.st_dev, mine.st_ino) == (now.st_dev, now.st_ino):
                    return handle
            except FileNotFoundError:
                pass
            handle.close()

    def marker(self) -> Marker | None:
        """The marker as it is now (None: none, or none that can be read: the folder is made again)."""
        try:
            return read_marker(self.path)
        except (OSError, MarkerFault):
            return None

    def write_marker(self, held: Mapping[str, Sequence[tuple[int, int]]], sums: dict[str, dict[str, str]]) -> None:
        """The marker: the ranges each file holds (merged) and each one's checksum, kept where a range is as it was
        and computed from the file where it is new (only ranges checked or just fetched are ever merged)."""
        files = {k: [(a, b) for a, b in merge(v)] for k, v in held.items()}
        kept = {
            name: {span_key(s): sums.get(name, {}).get(span_key(s)) or _digest(self.path / name, s) for s in spans}
            for name, spans in files.items()
        }
        write_atomic(self.path / PARTIAL, marker_text(files, kept))
        with contextlib.suppress(OSError):
            os.chmod(self.path / PARTIAL, 0o644)

    def make(self, files: Sequence[str] | None, hub_settings: HubSettings) -> bool:
        """The folder with every weight file's header in place (under the lock); False where the weights are
        neither safetensors nor GGUF (a ``.bin``, an adapter: downloaded whole). One made before is checked before it is trusted."""
        marker = self.marker()
        held, sums = (marker.files, marker.sums) if marker is not None else ({}, {})
        if held and all((self.path / name).is_file() for name in held):
            self._verify(held, sums, hub_settings)
            return True
        files = list(files) if files is not None else list_files(self.repo_id, self.revision, hub_settings)
        weights = self._copy_small_files(files, hub_settings)
        if weights is None:
            return False
        held = {name: spans for name, spans in held.items() if (self.path / name).is_file()}  # a file gone holds none
        self._verify(held, sums, hub_settings)  # what the files still there hold, checked
        todo = [name for name in weights if name not in held]
        for header in _headers(self.repo_id, self.revision, todo, hub_settings):
            name = header.file.filename
            with open(self.path / name, "wb") as f:  # sparse: only the header takes disk
                f.truncate(header.file.size)
                f.write(header.raw)
            held[name] = [(0, len(header.raw))]  # the header, and any data its requests brought
            sums[name] = {}
            if isinstance(header, SafetensorsHeader):
                self.headers[name] = header
        self.write_marker(held, sums)
        return True

    def opens(self) -> Path:
        """What a reader opens: the folder, or the GGUF file it holds (the first part of a split one)."""
        marker = self.marker()
        ggufs = sorted(name for name in (marker.files if marker is not None else {}) if name.lower().endswith(".gguf"))
        return self.path / ggufs[0] if ggufs else self.path

    def _copy_small_files(self, files: Sequence[str], hub_settings: HubSettings) -> list[str] | None:
        """``config.json`` and the shard index copied in (whole, through the cache); the weight files' names (None:
        the weights are neither safetensors nor GGUF; a GGUF needs no other file)."""
        repo_id, revision = self.repo_id, self.revision
        fmt = weight_format(files)
        ggufs = gguf_weights(files) if fmt is None else None  # the finest of its quantizations
        if ggufs is None and fmt not in ("safetensors", "safetensors-sharded"):
            return None
        self.path.mkdir(parents=True, exist_ok=True)
        for small in (CONFIG, *QUANT_CONFIGS):  # a quantizer's own config too (auto-gptq's, autoawq's)
            if small in files:
                shutil.copyfile(download_file(repo_id, small, revision, hub_settings), self.path / small)
        if ggufs is not None:
            for name in ggufs:
                check_filename(repo_id, name)
            if (parts := split_parts(ggufs)) is not None and parts[0] != parts[1]:
                have, said = parts
                raise CheckpointError(
                    repo_id, f"{shown(ggufs[0])}: a GGUF split in {said} files, {have} of them in the repository"
                )
            return ggufs
        if fmt == "safetensors-sharded":
            index_path = download_file(repo_id, SAFETENSORS_INDEX, revision, hub_settings)
            try:
                index = json.loads(Path(index_path).read_text())
            except (ValueError, UnicodeDecodeError) as exc:
                raise CheckpointError(repo_id, f"{SAFETENSORS_INDEX} is not JSON: {str(exc).splitlines()[0]}") from None
            weights = shard_names(repo_id, fmt, index, SAFETENSORS_INDEX)
            shutil.copyfile(index_path, self.path / SAFETENSORS_INDEX)
        else:
            weights = [SAFETENSORS]
        for name in weights:
            check_filename(repo_id, name)
        return weights

    def _verify(self, held: dict[str, Spans], sums: dict[str, dict[str, str]], hub_settings: HubSettings) -> None:
        """Every byte range the marker says the folder holds, checked against the checksum recorded when it was
        fetched: one that does not match (or has none: a marker of an earlier version) is no longer held, and is
        fetched again when wanted; a file's first range (its header, which the reader parses before asking for rows)
        is fetched again here. ``held`` and ``sums`` (the marker's) are updated to match."""
        bad: dict[str, Spans] = {}
        for name, spans in held.items():
            mine = sums.get(name, {})
            good = [
                span
                for span in spans
                if mine.get(span_key(span)) is not None and mine[span_key(span)] == _digest(self.path / name, span)
            ]
            if len(good) < len(spans):
                bad[name] = [span for span in spans if span not in good]
                held[name] = good
                sums[name] = {span_key(span): mine[span_key(span)] for span in good}
        if not bad:
            return
        heads = [self._job(n, [s[0]]) for n, s in bad.items() if s[0][0] == 0]
        for job, stats in zip(heads, fetch_many(heads, hub_settings, max_in_flight=IN_FLIGHT, gap=GAP, cap=CAP)):
            name = job.file.filename
            held[name] = [(0, job.file.size)] if stats.whole_file else merge([*held[name], *job.ranges])
        self.write_marker(held, sums)

    def _job(self, name: str, spans: Sequence[tuple[int, int]], held: Sequence[tuple[int, int]] = ()) -> RangeJob:
        """The requests for ``spans`` of file ``name``: within :data:`SHARE` of it with what it ``held``, if they fit."""
        path = self.path / name
        size = path.stat().st_size
        ceiling = int(SHARE * size) - sum(b - a for a, b in held)
        fits = sum(b - a for a, b in merge(spans)) <= ceiling
        return RangeJob(RemoteFile(self.repo_id, self.revision, name, size), spans, path, ceiling if fits else None)

    def states(self) -> dict[str, list[tuple[int, int]]]:
        """The byte ranges of the quantization states in the weight files (:func:`~modelvec.core.quantized.file_states`:
        a bitsandbytes 4-bit weight's JSON, its shape, read before the rows are planned)."""
        marker = self.marker()
        found = {name: file_states(self.path / name) for name in (marker.files if marker is not None else {})}
        return {name: spans for name, spans in found.items() if spans}

    def fill(self, wanted: Mapping[str, Sequence[tuple[int, int]]], hub_settings: HubSettings) -> Fetched:
        """Fetch the byte ranges ``wanted`` (per weight file) that the folder does not hold yet; the marker then
        lists them. A file a server sent whole (it ignored ``Range``) is held whole from then on."""
        with self.locked():
            marker = self.marker()
        held = marker.files if marker is not None else {}
        jobs = [
            self._job(name, _requested(need, self.path / name), held.get(name, []))
            for name, spans in wanted.items()
            if (need := missing(spans, held.get(name, [])))
        ]

        def record(i: int, stats: RangeStats) -> None:  # as each file completes: what it holds survives a later failure
            job = jobs[i]
            with self.locked():
                now = self.marker() or Marker()
                name = job.file.filename
                now.files[name] = (
                    [(0, job.file.size)] if stats.whole_file else merge([*now.files.get(name, []), *job.ranges])
                )
                self.write_marker(now.files, now.sums)

        done = Fetched()
        whole: list[str] = []
        # every file's ranges in one pool: the link stays busy from one shard to the next
        for job, stats in zip(
            jobs, fetch_many(jobs, hub_settings, max_in_flight=IN_FLIGHT, gap=GAP, cap=CAP, on_done=record)
        ):
            done.bytes += stats.bytes
            done.requests += stats.requests
            if stats.whole_file:
                whole.append(job.file.filename)
        done.whole_files = tuple(whole)
        return done

    def release(self) -> int:
        """Delete the folder, under its lock, and its lock file (so that the folder of partial downloads goes too
        when it is left empty); the bytes it held on disk (0 when there was none)."""
        if self.path.is_symlink() or not self.path.is_dir():
            return 0
        with self.locked():
            freed = 0
            if self.path.is_dir() and not self.path.is_symlink():  # not released meanwhile by another process
                files = [f for f in self.path.iterdir() if f.is_file() and not f.is_symlink()]
                freed = sum(f.stat().st_blocks * 512 for f in files)
                shutil.rmtree(self.path, ignore_errors=True)
            with contextlib.suppress(OSError):
                self.lock_path.unlink()  # a process waiting on it then takes a new one (see _lock_file)
        with contextlib.suppress(OSError):
            self.path.parent.rmdir()  # only when empty
        return freed


def open_partial(
    repo_id: str, revision: str, files: Sequence[str] | None, hub_settings: HubSettings
) -> PartialFolder | None:
    """The partial folder of ``repo_id`` at ``revision`` (a commit sha, or a branch pinned here), headers in place.

    None when its weights are not safetensors (a ``.bin``, an adapter): those are downloaded whole.
    ``files`` is the repository's file list at that revision (from discovery); None asks the Hub.
    """
    check_repo_id(repo_id)
    check_revision(repo_id, revision)
    if not is_commit_sha(revision):
        revision = pin(repo_id, revision, hub_settings)
    folder = PartialFolder(partial_folder(repo_id, revision, hub_settings), repo_id, revision)
    with folder.locked():
        if not folder.make(files, hub_settings):
            return None
    if states := folder.states():  # fetched once: a later open finds them held
        folder.fill(states, hub_settings)
    return folder


def _headers(
    repo_id: str, revision: str, names: Sequence[str], hub_settings: HubSettings
) -> list[SafetensorsHeader | GGUFHeader]:
    """The headers of a checkpoint's weight files (safetensors or GGUF, by name), requested together: one round
    trip for all shards, not one a shard (an 8B Llama's 4 shards, or 7 here and there, before its first row). The
    first failure is raised."""

    def header(name: str) -> SafetensorsHeader | GGUFHeader:
        fetch = fetch_gguf_header if name.lower().endswith(".gguf") else fetch_safetensors_header
        return fetch(repo_id, revision, name, hub_settings)

    if len(names) <= 1:
        return [header(name) for name in names]
    with ThreadPoolExecutor(min(IN_FLIGHT, len(names)), thread_name_prefix="headers") as pool:
        return list(pool.map(header, names))


def _requested(need: Sequence[tuple[int, int]], path: Path) -> list[tuple[int, int]]:
    """The ranges asked for ``need``: as they are, unless their requests would cost more than :data:`WHOLE` times the
    whole file (each request weighs :data:`GAP` bytes); then the gaps of up to :data:`GAP` between them are fetched
    too, whatever their neighbours' length (:func:`~modelvec.hub.ranges.coalesce_ranges` bounds them by it, to keep
    a share of rows a share of bytes). A GPTQ's or AWQ's rows are a small piece of every packed row: thousands of
    pieces a matrix, hundreds of times the file's cost in requests; rows stored as rows cost a few times at most."""
    if len(coalesce_ranges(need, GAP, CAP)) * GAP <= WHOLE * path.stat().st_size:
        return list(need)
    return merge(need, GAP)


def release_partial(repo_id: str, revision: str, hub_settings: HubSettings) -> int:
    """Delete the partial download of one revision (:meth:`PartialFolder.release`); the bytes it held on disk (0
    when there was none, or the names are not ones a partial download is kept under)."""
    try:
        check_repo_id(repo_id)
        check_revision(repo_id, revision)
    except FetchError:
        return 0
    if not is_commit_sha(revision):
        return 0
    return PartialFolder(partial_folder(repo_id, revision, hub_settings), repo_id, revision).release()


def _digest(path: Path, span: tuple[int, int]) -> str | None:
    """The xxh3 of a file's bytes ``[start, stop)`` (None where the file is shorter or cannot be read)."""
    digest, (at, stop) = xxhash.xxh3_64(), span
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        while at < stop:
            chunk = os.pread(fd, min(stop - at, 1 << 24), at)
            if not chunk:
                return None
            digest.update(chunk)
            at += len(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    return digest.hexdigest()
