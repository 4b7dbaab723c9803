"""The append-only float32 file that holds the vectors' bytes beside the DuckDB file.

Kept in DuckDB as ``FLOAT[]``, vectors made the writer's memory grow with every row (the buffer pool
and checkpoints hold written list blocks: +250 MB per 600 bert-base vectors, and a capped
``memory_limit`` made checkpoints fail fatally), and each insert cost 10-15 ms. The bytes are
fsynced before the row that points at them commits, so a committed row never points at missing
bytes; bytes written by a run killed before its commit are unreferenced, never read.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Sequence
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

import numpy as np
import xxhash

from ..core.errors import ResourceError, StoreError


class VectorFile:
    """The append-only float32 file that holds the vectors' bytes; DuckDB holds the rows.

    Appends go to the end (aligned to 64 bytes) and are fsynced; only then does the caller commit
    the rows that point at them. Reads copy each vector once,
    from the page cache into the result, and writing keeps nothing in the process.
    """

    MAGIC = b"modelvec vectors float32-le v1\n".ljust(64, b"\0")
    ALIGN = 64

    def __init__(self, path: Path, *, read_only: bool = False) -> None:
        """``read_only``: only for reading (no file is created; a missing one holds no vectors)."""
        self.path = path
        self._lock = threading.Lock()
        if read_only and not path.exists():
            self._fd = -1
            return
        self._fd = -1
        try:
            self._fd = os.open(path, os.O_RDONLY if read_only else os.O_RDWR | os.O_CREAT, 0o644)
            head = os.pread(self._fd, len(self.MAGIC), 0)  # a folder opens read-only, and fails here
        except OSError as exc:
            self.close()
            cause = "a folder, not a modelvec vector file" if path.is_dir() else (exc.strerror or str(exc)).lower()
            raise StoreError(str(path), cause) from None
        if read_only and head != self.MAGIC and head:
            os.close(self._fd)
            raise StoreError(str(path), "not a modelvec vector file (bad header)")
        if read_only:
            return
        if not head:
            try:
                _pwrite_all(self._fd, memoryview(self.MAGIC), 0)
                os.fsync(self._fd)
            except OSError as exc:
                os.close(self._fd)
                raise self._write_error(exc) from None
        elif head != self.MAGIC:
            os.close(self._fd)
            raise StoreError(str(path), "not a modelvec vector file (bad header)")

    def append(self, vectors: Sequence[np.ndarray]) -> list[int]:
        """Write ``vectors`` (contiguous float32) at the end, fsync, and return their byte offsets.

        The thread lock orders the appends of this object's users (the compute thread and a
        :class:`StoreWriter`); the ``flock`` orders those of another ``VectorFile`` of the same file
        (another ``Store`` of one path in this process, or a process still writing after it lost
        DuckDB's lock), each of which would otherwise take the same end for its offset.

        A write that fails (a full disk, an I/O error) is a :class:`ResourceError` (out of space) or a
        :class:`StoreError` naming the file; what it wrote is cut off again, so the file is as it was.
        """
        if not vectors:
            return []
        offsets = []
        with self._lock:
            if fcntl is not None:
                fcntl.flock(self._fd, fcntl.LOCK_EX)
            start = -1
            try:
                start = end = os.fstat(self._fd).st_size
                for vec in vectors:
                    end += -end % self.ALIGN  # a run killed mid-append leaves an unaligned tail: skip past it
                    _pwrite_all(self._fd, vec.data.cast("B"), end)
                    offsets.append(end)
                    end += vec.nbytes
                os.fdatasync(self._fd)
            except OSError as exc:
                if start >= 0:  # under the flock, only this append wrote past ``start``: no row points there
                    try:
                        os.ftruncate(self._fd, start)
                    except OSError:
                        pass
                raise self._write_error(exc) from None
            finally:
                if fcntl is not None:
                    fcntl.flock(self._fd, fcntl.LOCK_UN)
        return offsets

    def _write_error(self, exc: OSError) -> StoreError | ResourceError:
        """A failed write of this file as one line naming it: out of space is the machine (``resource``)."""
        kept = "what was stored before is kept"
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            words = "no space left on the device" if exc.errno == errno.ENOSPC else "disk quota exceeded"
            return ResourceError(str(self.path), f"cannot write: {words}; {kept}")
        return StoreError(str(self.path), f"cannot write: {(exc.strerror or str(exc)).lower()}; {kept}")

    def read(self, offsets: Sequence[int], dim: int, hashes: Sequence[str], models: Sequence[str]) -> np.ndarray:
        """The vectors at ``offsets`` as one (n, dim) float32 matrix, each checked against its hash."""
        out = np.empty((len(offsets), dim), np.float32)
        if not len(offsets):
            return out
        if self._fd < 0:
            raise StoreError(
                models[0], f"its stored vector is missing: there is no {self.path}; re-embed it with --force"
            )
        nbytes = dim * 4
        for i in np.argsort(offsets, kind="stable"):  # in file order: sequential reads
            offset, digest, model = offsets[i], hashes[i], models[i]
            raw = out[i].view(np.uint8)
            if os.preadv(self._fd, [raw], offset) != nbytes:  # one copy, page cache -> result; no page faults
                raise StoreError(
                    model,
                    f"its stored vector is missing from {self.path} (the file is truncated); re-embed it with --force",
                )
            if checksum(raw) != digest:
                raise StoreError(
                    model, f"its stored vector in {self.path} does not match its checksum; re-embed it with --force"
                )
        return out

    def read_raw(self, offset: int, raw: np.ndarray) -> int:
        """Read ``raw.nbytes`` bytes at ``offset`` into ``raw`` (one copy, no page faults); the bytes read (0: no file)."""
        return os.preadv(self._fd, [raw.data], offset) if self._fd >= 0 else 0

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    """Write all of ``data`` at ``offset``. ``pwrite`` may write less than asked (a disk that fills up mid-write
    takes what fits and says so only in its count): the rest is written again, and then the disk's error raises."""
    done = 0
    while done < len(data):
        written = os.pwrite(fd, data[done:], offset + done)
        if written <= 0:  # no progress and no error: never loop for ever
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        done += written


def vector_bytes(vector: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(vector, dtype="<f4").reshape(-1)


def checksum(raw: np.ndarray) -> str:
    """A vector's checksum as its row stores it: xxh3-64 of its bytes."""
    return xxhash.xxh3_64_hexdigest(raw.data)


def zero_checksum(dim: int) -> str:
    """The checksum of an all-zero vector of ``dim`` floats: a model whose weights are the base's has it."""
    return checksum(np.zeros(dim, np.float32).view(np.uint8))
