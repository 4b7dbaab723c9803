"""Files kept beside the store and read again by later runs (the vectors' products, the mutual-proximity spreads):
each holds the checksums written with it, so a reader trusts only what verifies.

A kept file is a header, then its arrays. The header says what the file was computed for (``meta``: e.g. the
checksums of the vectors whose products it holds) and, per array, its type, shape, place and an xxh3 of each row
(of the whole array, for a 1-D one); the header has an xxh3 of its own. :func:`read_cache_file` maps the arrays, read
only, and checks every row against its checksum (27 GB/s: 30 ms for the 800 MB of 10,000 models' products): a
row that does not verify is named in ``damaged``, so a reader recomputes that row (one vector's products against
every other), not the whole file. A header that does not verify, a file cut short or one that is not a kept file
is :attr:`CacheFile.problem`, one line, and nothing of it is used. Files are written whole under a temporary name,
then renamed, so a reader never sees half of one. The writer holds an ``flock`` on its temporary file until it is
renamed, so the temporary files a killed process left (up to 800 MB at 10,000 models) are told from one being
written, and removed when the folder is written next (:func:`remove_leftovers`).
"""

from __future__ import annotations

import json
import os
import re
import stat
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

MAGIC = b"modelvec kept file v1\n"
_ALIGN = 64
#: The temporary name :func:`write_cache_file` writes under: ``.<name>.<8 hex>.tmp``
_TEMPORARY = re.compile(r"\..+\.[0-9a-f]{8}\.tmp")
#: A temporary file younger than this is never removed (it may have been made, not yet locked, by its writer);
#: without ``flock`` (not POSIX) only one older than a day is
LEFTOVER_AGE = 60.0


@dataclass
class CacheFile:
    """What a kept file holds: ``meta`` and its ``arrays`` (read-only memory maps), ``damaged``: per array, the rows
    (indices along its first axis; ``[0]`` for a 1-D array: all of it) that do not match their checksums. ``problem``
    (one line) where nothing of the file can be used: then ``meta`` and ``arrays`` are empty."""

    meta: dict[str, Any] = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    damaged: dict[str, np.ndarray] = field(default_factory=dict)
    problem: str | None = None


def row_checksums(array: np.ndarray) -> list[str]:
    """The xxh3 of each row of ``array`` (its first axis), or of the whole of a 0-D or 1-D array."""
    if array.ndim <= 1:
        return [xxhash.xxh3_64_hexdigest(np.ascontiguousarray(array).data)]
    if array.size == 0:
        return [xxhash.xxh3_64_hexdigest(b"")] * len(array)
    whole = np.ascontiguousarray(array).data.cast("B")  # the rows as byte slices: no array made a row
    step = whole.nbytes // len(array)
    return [xxhash.xxh3_64_hexdigest(whole[i : i + step]) for i in range(0, whole.nbytes, step)]


def write_cache_file(path: Path, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> bool:
    """Keep ``arrays`` (made contiguous, little-endian) with ``meta`` at ``path``: written whole under a temporary
    name, then renamed. False where it could not be written (a cache that cannot be kept is no cache, never an
    error: the next run computes it again)."""
    laid: list[tuple[int, np.ndarray]] = []
    specs = []
    offset = 0
    for name, value in arrays.items():
        array = np.ascontiguousarray(value, dtype=np.asarray(value).dtype.newbyteorder("<"))
        offset += -offset % _ALIGN
        specs.append(
            {
                "name": name,
                "dtype": array.dtype.str,
                "shape": list(array.shape),
                "offset": offset,
                "rows": row_checksums(array),
            }
        )
        laid.append((offset, array))
        offset += array.nbytes
    header = json.dumps({"meta": dict(meta), "arrays": specs}).encode()
    head = MAGIC + len(header).to_bytes(8, "little") + xxhash.xxh3_64_digest(header) + header
    start = len(head) + (-len(head) % _ALIGN)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_leftovers(path.parent)
        with open(tmp, "wb") as fh:
            if fcntl is not None:  # held until renamed: a sweep of the folder leaves it alone
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
            fh.write(head + b"\0" * (start - len(head)))
            for at, array in laid:
                fh.seek(start + at)
                array.tofile(fh)
            fh.flush()
            os.replace(tmp, path)
        return True
    except (OSError, ValueError):
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        return False


def remove_leftovers(folder: Path, age: float = LEFTOVER_AGE) -> list[Path]:
    """Remove the temporary files of :func:`write_cache_file` in ``folder`` that no process is writing (a killed one's):
    only plain files named exactly as it names them, older than ``age`` seconds, whose ``flock`` can be taken (a
    writer holds it until it renames the file; a dead one's is released). The files removed; any that cannot be
    looked at is left (a cache that cannot be tidied is no error)."""
    removed: list[Path] = []
    try:
        entries = [e for e in os.scandir(folder) if _TEMPORARY.fullmatch(e.name)]
    except OSError:
        return removed
    oldest = time.time() - (age if fcntl is not None else 86400.0)
    for entry in entries:
        try:
            old = entry.is_file(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_mtime < oldest
            if old and _remove_unlocked(Path(entry.path)):
                removed.append(Path(entry.path))
        except OSError:
            continue
    return removed


def _remove_unlocked(path: Path) -> bool:
    """Remove ``path`` where its ``flock`` can be taken and it is still the file opened (not renamed since)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    try:
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # being written
                return False
        mine, named = os.fstat(fd), os.lstat(path)
        if not stat.S_ISREG(mine.st_mode) or (mine.st_dev, mine.st_ino) != (named.st_dev, named.st_ino):
            return False
        path.unlink()
        return True
    finally:
        os.close(fd)


def read_cache_file(path: Path) -> CacheFile | None:
    """The kept file at ``path``, every row checked (None: there is none; a folder or an unreadable path is one)."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if fh.read(len(MAGIC)) != MAGIC:
                return CacheFile(problem="not a modelvec kept file (bad header)")
            length = int.from_bytes(fh.read(8), "little")
            digest = fh.read(8)
            if length > size:
                return CacheFile(problem="truncated: shorter than its header says")
            header = fh.read(length)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None
    except OSError as exc:
        return CacheFile(problem=f"cannot be read ({(exc.strerror or str(exc)).lower()})")
    if len(header) != length or xxhash.xxh3_64_digest(header) != digest:
        return CacheFile(problem="its header does not match its checksum")
    try:
        spec = json.loads(header)
        return _mapped(path, spec, size, len(MAGIC) + 16 + length)
    except (ValueError, KeyError, TypeError) as exc:  # a header that verifies but is not ours: another version
        return CacheFile(problem=f"its header is not readable ({type(exc).__name__})")


def _mapped(path: Path, spec: dict[str, Any], size: int, head: int) -> CacheFile:
    """The arrays of a verified header, mapped read-only, each row checked."""
    start = head + (-head % _ALIGN)
    kept = CacheFile(meta=dict(spec["meta"]))
    for item in spec["arrays"]:
        dtype, shape = np.dtype(item["dtype"]), tuple(int(s) for s in item["shape"])
        at = start + int(item["offset"])
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if at + nbytes > size:
            return CacheFile(problem="truncated: shorter than its header says")
        array = (
            np.memmap(path, dtype, "r", offset=at, shape=shape) if nbytes else np.zeros(shape, dtype)
        )  # an empty array maps nothing
        found = row_checksums(array)
        if len(found) != len(item["rows"]):
            return CacheFile(problem="its header is not readable (row checksums)")
        kept.arrays[item["name"]] = array
        kept.damaged[item["name"]] = np.array(
            [i for i, (a, b) in enumerate(zip(found, item["rows"])) if a != b], dtype=np.int64
        )
    return kept
