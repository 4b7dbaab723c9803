"""A Hub model read by byte ranges: a local folder that holds only what its vector needs.

When a representation reads a share of each matrix's rows, a fine-tune's multi-GB safetensors shards need not
come whole. :func:`open_partial` makes a folder that stands for the model at a commit: ``config.json`` and the
shard index downloaded whole (small, through the huggingface_hub cache), and each weight file as a *sparse* file of
its real size holding only its header (fetched by a range request: :func:`~modelvec.hub.ranges.fetch_safetensors_header`).
The reader opens it as any checkpoint and says which byte ranges the vector needs; :func:`fill_partial` fetches
those (and only those not already there) into the sparse files at their own offsets. A marker file
(:data:`~modelvec.core.files.PARTIAL`) lists the byte ranges each file holds, so the reader refuses to read
anything else (a hole reads as zeros), and a later run with other rows fetches only what it lacks.

The folder lives in the repository's folder of the huggingface_hub cache (``<repo>/.modelvec/partial/<sha>``,
beside huggingface_hub's own ``snapshots``), pinned to the commit sha, and is deleted by :func:`release_partial`
(``--no-keep-weights``) as a snapshot is. Only safetensors can be read so: a pickled ``.bin`` has no byte layout
to read it by, and a LoRA adapter is small; :func:`open_partial` returns None for those and the caller downloads
them whole.
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

from ..core.errors import CheckpointError, FetchError
from ..core.files import CONFIG, PARTIAL, SAFETENSORS, SAFETENSORS_INDEX, weight_format
from ..core.spans import merge, missing
from .client import HubSettings
from .download import (
    check_filename,
    check_repo_id,
    check_revision,
    download_file,
    list_files,
    pin,
    repo_folder,
    shard_names,
    write_atomic,
)
from .ids import is_commit_sha
from .ranges import (
    REQUEST_CAP,
    RangeJob,
    RangeStats,
    RemoteFile,
    SafetensorsHeader,
    fetch_many,
    fetch_safetensors_header,
    gap_worth,
)

_LOCK = threading.Lock()  # guards _LOCKS
_LOCKS: dict[Path, threading.Lock] = {}  # per folder: one process's threads fill one folder's marker in turn


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """The folder's marker and files to this thread alone, across processes too (Ray workers, two runs): a folder
    made twice at once would truncate the other's fetched bytes, and a marker written from a stale read would
    drop ranges the other fetched."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with _LOCK:
        lock = _LOCKS.setdefault(folder, threading.Lock())
    with lock, open(folder.parent / f"{folder.name}.lock", "a+b") as handle:
        if fcntl is not None:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        yield


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


@dataclass
class Fetched:
    """What :func:`fill_partial` fetched: bytes over the network, requests, and the files a server sent whole."""

    bytes: int = 0
    requests: int = 0
    whole_files: tuple[str, ...] = ()


def partial_folder(repo_id: str, revision: str, hub_settings: HubSettings) -> Path:
    """Where the partial download of ``repo_id`` at commit ``revision`` lives (inside its cache folder)."""
    return repo_folder(repo_id, hub_settings) / ".modelvec" / "partial" / revision


def open_partial(repo_id: str, revision: str, files: Sequence[str] | None, hub_settings: HubSettings) -> Path | None:
    """The partial folder of ``repo_id`` at ``revision`` (a commit sha, or a branch pinned here), headers in place.

    None when its weights are not safetensors (a ``.bin``, an adapter): those are downloaded whole.
    ``files`` is the repository's file list at that revision (from discovery); None asks the Hub.
    """
    check_repo_id(repo_id)
    check_revision(repo_id, revision)
    if not is_commit_sha(revision):
        revision = pin(repo_id, revision, hub_settings)
    folder = partial_folder(repo_id, revision, hub_settings)
    with _locked(folder):
        return _make_partial(folder, repo_id, revision, files, hub_settings)


def _make_partial(
    folder: Path, repo_id: str, revision: str, files: Sequence[str] | None, hub_settings: HubSettings
) -> Path | None:
    held, sums = _read_marker(folder)
    if held and all((folder / name).is_file() for name in held):  # made before: checked before it is trusted
        _verify(folder, repo_id, revision, held, sums, hub_settings)
        return folder
    files = list(files) if files is not None else list_files(repo_id, revision, hub_settings)
    fmt = weight_format(files)
    if fmt not in ("safetensors", "safetensors-sharded"):
        return None
    folder.mkdir(parents=True, exist_ok=True)
    if CONFIG in files:
        shutil.copyfile(download_file(repo_id, CONFIG, revision, hub_settings), folder / CONFIG)
    if fmt == "safetensors-sharded":
        index_path = download_file(repo_id, SAFETENSORS_INDEX, revision, hub_settings)
        try:
            index = json.loads(Path(index_path).read_text())
        except (ValueError, UnicodeDecodeError) as exc:
            raise CheckpointError(repo_id, f"{SAFETENSORS_INDEX} is not JSON: {str(exc).splitlines()[0]}") from None
        weights = shard_names(repo_id, fmt, index, SAFETENSORS_INDEX)
        shutil.copyfile(index_path, folder / SAFETENSORS_INDEX)
    else:
        weights = [SAFETENSORS]
    for name in weights:
        check_filename(repo_id, name)
    held = {name: spans for name, spans in (held or {}).items() if (folder / name).is_file()}  # a file gone holds none
    _verify(folder, repo_id, revision, held, sums, hub_settings)  # what the files still there hold, checked
    todo = [name for name in weights if name not in held]
    for header in _headers(repo_id, revision, todo, hub_settings):
        name = header.file.filename
        with open(folder / name, "wb") as f:  # sparse: only the header takes disk
            f.truncate(header.file.size)
            f.write(header.raw)
        held[name] = [(0, header.data_start)]
        sums[name] = {}
    _write_marker(folder, held, sums)
    return folder


def _verify(
    folder: Path, repo_id: str, revision: str, held: dict, sums: dict[str, dict[str, str]], hub_settings: HubSettings
) -> None:
    """Every byte range the marker says the folder holds, checked against the checksum recorded when it was
    fetched: one that does not match (or has none: a marker of an earlier version) is no longer held, and is
    fetched again when wanted; a file's first range (its header, which the reader parses before asking for rows)
    is fetched again here. ``held`` and ``sums`` (the marker's) are updated to match."""
    bad: dict[str, list[tuple[int, int]]] = {}
    for name, spans in held.items():
        mine = sums.get(name, {})
        good = [
            span
            for span in spans
            if mine.get(_key(span)) is not None and mine[_key(span)] == _digest(folder / name, span)
        ]
        if len(good) < len(spans):
            bad[name] = [span for span in spans if span not in good]
            held[name] = good
            sums[name] = {_key(span): mine[_key(span)] for span in good}
    if not bad:
        return
    heads = [
        RangeJob(RemoteFile(repo_id, revision, n, (folder / n).stat().st_size), [s[0]], folder / n)
        for n, s in bad.items()
        if s[0][0] == 0
    ]
    for job, stats in zip(heads, fetch_many(heads, hub_settings, max_in_flight=IN_FLIGHT, gap=GAP, cap=CAP)):
        name = job.file.filename
        held[name] = [(0, job.file.size)] if stats.whole_file else merge([*held[name], *job.ranges])
    _write_marker(folder, held, sums)


def _headers(repo_id: str, revision: str, names: Sequence[str], hub_settings: HubSettings) -> list[SafetensorsHeader]:
    """The headers of a checkpoint's weight files, requested together: one round trip for all shards, not one a
    shard (an 8B Llama's 4 shards, or 7 here and there, before its first row). The first failure is raised."""
    if len(names) <= 1:
        return [fetch_safetensors_header(repo_id, revision, name, hub_settings) for name in names]
    with ThreadPoolExecutor(min(IN_FLIGHT, len(names)), thread_name_prefix="headers") as pool:
        return list(pool.map(lambda name: fetch_safetensors_header(repo_id, revision, name, hub_settings), names))


def fill_partial(
    folder: Path,
    repo_id: str,
    revision: str,
    wanted: Mapping[str, Sequence[tuple[int, int]]],
    hub_settings: HubSettings,
) -> Fetched:
    """Fetch the byte ranges ``wanted`` (per weight file of ``folder``) that it does not hold yet; the marker then
    lists them. A file a server sent whole (it ignored ``Range``) is held whole from then on."""
    done = Fetched()
    whole: list[str] = []
    with _locked(folder):
        held = _read_marker(folder)[0] or {}
    jobs = []
    for name, spans in wanted.items():
        need = missing(spans, held.get(name, []))
        if need:
            path = folder / name
            jobs.append(RangeJob(RemoteFile(repo_id, revision, name, path.stat().st_size), need, path))

    def record(i: int, stats: RangeStats) -> None:  # as each file completes: what it holds survives a later failure
        job = jobs[i]
        with _locked(folder):
            held, sums = _read_marker(folder)
            held = held or {}
            name = job.file.filename
            held[name] = [(0, job.file.size)] if stats.whole_file else merge([*held.get(name, []), *job.ranges])
            _write_marker(folder, held, sums)

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


def release_partial(repo_id: str, revision: str, hub_settings: HubSettings) -> int:
    """Delete the partial download of one revision; the bytes it held on disk (0 when there was none)."""
    try:
        check_repo_id(repo_id)
        check_revision(repo_id, revision)
    except FetchError:
        return 0
    if not is_commit_sha(revision):
        return 0
    folder = partial_folder(repo_id, revision, hub_settings)
    if folder.is_symlink() or not folder.is_dir():
        return 0
    freed = sum(f.stat().st_blocks * 512 for f in folder.iterdir() if f.is_file() and not f.is_symlink())
    shutil.rmtree(folder, ignore_errors=True)
    with contextlib.suppress(OSError):
        folder.parent.rmdir()  # only when empty
    return freed


def _read_marker(folder: Path) -> tuple[dict[str, list[tuple[int, int]]] | None, dict[str, dict[str, str]]]:
    """The marker: the byte ranges each file holds (None: no readable marker) and each range's checksum, per file,
    by ``"start-stop"`` (empty where the marker has none: one of an earlier version)."""
    try:
        marker = json.loads((folder / PARTIAL).read_text())
        files, sums = marker.get("files"), marker.get("sums")
    except (OSError, ValueError, AttributeError):
        return None, {}
    if not isinstance(sums, dict):
        sums = {}
    sums = {str(k): {str(a): str(b) for a, b in v.items()} for k, v in sums.items() if isinstance(v, dict)}
    if not isinstance(files, dict):
        return None, sums
    try:
        return {str(k): [(int(a), int(b)) for a, b in v] for k, v in files.items()}, sums
    except (TypeError, ValueError):
        return None, sums


def _key(span: tuple[int, int]) -> str:
    return f"{span[0]}-{span[1]}"


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


def _write_marker(folder: Path, held: Mapping[str, Sequence[tuple[int, int]]], sums: dict[str, dict[str, str]]) -> None:
    """The marker: the ranges each file holds (merged) and each one's checksum, kept where a range is as it was
    and computed from the file where it is new (only ranges checked or just fetched are ever merged)."""
    files = {k: [(a, b) for a, b in merge(v)] for k, v in held.items()}
    kept = {
        name: {_key(s): sums.get(name, {}).get(_key(s)) or _digest(folder / name, s) for s in spans}
        for name, spans in files.items()
    }
    marker = {"files": {k: [list(s) for s in v] for k, v in files.items()}, "sums": kept}
    write_atomic(folder / PARTIAL, json.dumps(marker))
    with contextlib.suppress(OSError):
        os.chmod(folder / PARTIAL, 0o644)
