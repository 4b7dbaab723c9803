"""The append-only float32 file that holds the vectors' bytes beside the DuckDB file.

CacheFile in DuckDB as ``FLOAT[]``, vectors made the writer's memory grow with every row (the buffer pool
and checkpoints hold written list blocks: +250 MB per 600 bert-base vectors, and a capped
``memory_limit`` made checkpoints fail fatally), and each insert cost 10-15 ms. The bytes are
fsynced before the row that points at them commits, so a committed row never points at missing
bytes; bytes written by a run killed before its commit are unreferenced, never read.

Its 64-byte header names the store it belongs to (its identity, kept in the store's ``store_meta``), so a vector
file of another store is refused in one line rather than read as damaged, and only files of this store are ever
removed beside it. Files written before stores had an identity have the header without it: they are read as ever.
"""

from __future__ import annotations

import errno
import glob
import os
import re
import stat
import threading
import uuid
from collections.abc import Sequence
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

import numpy as np
import xxhash

from ...core.errors import ResourceError, StoreError
from ...core.files import pwrite_all


class VectorFile:
    """The append-only float32 file that holds the vectors' bytes; DuckDB holds the rows.

    Appends go to the end (aligned to 64 bytes) and are fsynced; only then does the caller commit
    the rows that point at them. Reads copy each vector once,
    from the page cache into the result, and writing keeps nothing in the process.
    """

    MAGIC = b"modelvec vectors float32-le v1\n".ljust(
        64, b"\0"
    )  # the header without an identity (an earlier version's)
    ALIGN = 64

    def __init__(self, path: Path, *, read_only: bool = False, identity: str | None = None) -> None:
        """``read_only``: only for reading (no file is created; a missing one holds no vectors). ``identity``: the
        store's, written into the header of a file created here; :attr:`identity` is the one the header carries
        (None: a header written before identities, or no file)."""
        self.path = path
        self._lock = threading.Lock()
        self.identity: str | None = None
        self._fd = -1
        if read_only and not path.exists():
            return
        try:
            self._fd = os.open(path, os.O_RDONLY if read_only else os.O_RDWR | os.O_CREAT, 0o644)
            head = os.pread(self._fd, len(self.MAGIC), 0)  # a folder opens read-only, and fails here
        except OSError as exc:
            self.close()
            cause = "a folder, not a modelvec vector file" if path.is_dir() else (exc.strerror or str(exc)).lower()
            raise StoreError(str(path), cause) from None
        if not head and not read_only:
            try:
                pwrite_all(self._fd, memoryview(header(identity)), 0)
                os.fsync(self._fd)
            except OSError as exc:
                self.close()
                raise self._write_error(exc) from None
            self.identity = identity
        elif head:
            ours, self.identity = read_header(head)
            if not ours:
                self.close()
                raise StoreError(str(path), "not a modelvec vector file (bad header)")

    @property
    def exists(self) -> bool:
        """Whether there is a file (one opened read-only may be missing)."""
        return self._fd >= 0

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
                    pwrite_all(self._fd, vec.data.cast("B"), end)
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
        """The vectors at ``offsets`` as one (n, dim) float32 matrix, each checked against its hash (the first that is
        not there or does not match raises :class:`StoreError` naming its model and why: :meth:`problem`)."""
        out = np.empty((len(offsets), dim), np.float32)
        if not len(offsets):
            return out
        for i in np.argsort(offsets, kind="stable"):  # in file order: sequential reads
            raw = out[i].view(np.uint8)
            cause = self.problem(self.read_raw(offsets[i], raw), raw, hashes[i])  # one copy, page cache -> result
            if cause is not None:
                raise StoreError(models[i], cause)
        return out

    def problem(self, got: int, raw: np.ndarray, digest: str) -> str | None:
        """Why a vector read into ``raw`` (``got`` bytes of it read) cannot be used, in words; None: it can. Its file
        missing, cut short before its bytes, or bytes that do not match their checksum are three causes, each
        said as it is (a missing file is no damage: it was left behind when the store was copied or renamed)."""
        if self._fd < 0:
            return (
                f"its stored vector is missing: there is no {self.path} (a store's files are copied or renamed "
                "together); re-embed it with --force"
            )
        if got != raw.nbytes:
            return f"its stored vector is missing from {self.path} (the file is truncated); re-embed it with --force"
        if checksum(raw) != digest:
            return f"its stored vector in {self.path} does not match its checksum; re-embed it with --force"
        return None

    def signature(self) -> list[int] | None:
        """What says the file is as it was: its inode, size and modification and change times (ns); None without a
        file. Any write through the file system changes it (the change time cannot be set back)."""
        if self._fd < 0:
            return None
        st = os.fstat(self._fd)
        return [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]

    def read_raw(self, offset: int, raw: np.ndarray) -> int:
        """Read ``raw.nbytes`` bytes at ``offset`` into ``raw`` (one copy, no page faults); the bytes read (0: no file)."""
        return os.preadv(self._fd, [raw.data], offset) if self._fd >= 0 else 0

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


_IDENTITY = re.compile(rb"store ([0-9a-f]{16})\n\0*")


def new_identity() -> str:
    """A store's identity: 16 random hex digits, written in its ``store_meta`` and in its vector files' headers."""
    return uuid.uuid4().hex[:16]


def header(identity: str | None) -> bytes:
    """A vector file's 64 bytes of header: the magic line, then the store's identity where there is one."""
    line = VectorFile.MAGIC.rstrip(b"\0")
    return (line + (f"store {identity}\n".encode() if identity is not None else b"")).ljust(VectorFile.ALIGN, b"\0")


def read_header(head: bytes) -> tuple[bool, str | None]:
    """Whether ``head`` (a file's first 64 bytes) is a vector file's header, and the store identity it carries (None:
    a header written before identities)."""
    if head == VectorFile.MAGIC:
        return True, None
    line = VectorFile.MAGIC.rstrip(b"\0")
    found = _IDENTITY.fullmatch(head[len(line) :]) if len(head) == VectorFile.ALIGN and head.startswith(line) else None
    return (True, found[1].decode()) if found else (False, None)


def identity_of(path: Path) -> str | None:
    """The store identity in the header of the vector file at ``path``; None where it has none (written before
    identities), is not a vector file, or is not a plain file (a link is not followed)."""
    try:  # never blocks on a FIFO, never follows a link
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    try:
        head = os.pread(fd, VectorFile.ALIGN, 0) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
    except OSError:
        return None
    finally:
        os.close(fd)
    return read_header(head)[1]


_SUFFIX = re.compile(r"(?:.*\.vectors\.)?([0-9a-f]{12})")  # what a store records: the name, or its suffix


def vector_path(store: Path, recorded: str | None) -> Path:
    """The vector file of the store at ``store``: ``<its name>.vectors``, or after a compaction that name and the 12
    hex digits that end the name the store records. Only those digits are read (stores compacted by an earlier version
    record the whole name, as this version still does, for older versions): a store copied or renamed with its
    files, as cp and mv do, finds its own file, never the original's."""
    name = f"{store.name}.vectors"
    if recorded is None:
        return store.parent / name
    found = _SUFFIX.fullmatch(recorded)
    if found is None:
        raise StoreError(
            str(store), f"the name it records for its vector file is not one modelvec writes: {recorded[:80]!r}"
        )
    return store.parent / f"{name}.{found[1]}"


def remove_leftovers(store: Path, current: Path, identity: str) -> list[Path]:
    """Remove the files beside the store at ``store`` that a crashed compaction of it left (``<its name>.vectors``,
    ``<its name>.vectors.<12 hex>``, other than ``current``), only those whose header carries its ``identity``: a
    file written before identities, or for another store (one renamed over this name), is never removed. The
    files removed."""
    ours = re.compile(re.escape(f"{store.name}.vectors") + r"(\.[0-9a-f]{12})?")
    removed = []
    for other in store.parent.glob(f"{glob.escape(store.name)}.vectors*"):
        if other != current and ours.fullmatch(other.name) and identity_of(other) == identity:
            other.unlink(missing_ok=True)
            removed.append(other)
    return removed


def vector_bytes(vector: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(vector, dtype="<f4").reshape(-1)


def checksum(raw: np.ndarray) -> str:
    """A vector's checksum as its row stores it: xxh3-64 of its bytes."""
    return xxhash.xxh3_64_hexdigest(raw.data)


def zero_checksum(dim: int) -> str:
    """The checksum of an all-zero vector of ``dim`` floats: a model whose weights are the base's has it."""
    return checksum(np.zeros(dim, np.float32).view(np.uint8))
