"""One process at a time writes a store: opening waits for another process's DuckDB lock, for a while."""

from __future__ import annotations

import logging
import math
import os
import random
import re
import time
from collections.abc import Callable
from pathlib import Path

import duckdb

from ...core import constants
from ...core.errors import StoreError, StoreLockedError

DEFAULT_WAIT = 600.0  # seconds a Store waits for another process's lock on its file ($MODELVEC_STORE_WAIT)
_RETRY = (0.2, 0.4)  # seconds between two attempts to open a locked store (random, so waiters do not march in step)
_log = logging.getLogger("modelvec.store")


def default_wait() -> float:
    """``$MODELVEC_STORE_WAIT`` (seconds; ``inf`` waits for ever) or 600."""
    wait = constants.store_wait()
    return DEFAULT_WAIT if wait is None else wait


_LOCKED = re.compile(r"Could not set lock on file|Conflicting lock is held")
#: What DuckDB's errors on opening a file mean, in a few words.
_CAUSES = (
    ("not a valid DuckDB database", "not a modelvec store (not a DuckDB database file)"),
    ("Could not read enough bytes", "damaged: the file is truncated"),
    ("Read-only file system", "on a read-only file system: cannot be written here (read-only commands can read it)"),
    ("Permission denied", "permission denied"),
    ("No space left on device", "no space left on the device; what was stored before is kept"),
    ("Is a directory", "a folder, not a store"),
    ("Corrupt database file", "damaged: a block of it does not match its checksum"),
)


def _cause(exc: BaseException) -> str:
    text = str(exc)
    known = next((cause for needle, cause in _CAUSES if needle in text), None)
    if known is not None:
        return known
    first = text.splitlines()[0] if text else type(exc).__name__
    return first.removeprefix("IO Error: ").removeprefix("Catalog Error: ")[:200]


def store_error(path: str | os.PathLike[str], exc: BaseException) -> StoreError:
    """DuckDB's error ``exc`` about the store at ``path`` (on opening it, or on a later read or write: a full disk, a
    damaged block) as one :class:`StoreError` line naming the file and the cause in a few words."""
    return StoreError(str(path), _cause(exc))


_HOLDER = re.compile(r"Conflicting lock is held in (?P<program>.*?) \(PID (?P<pid>\d+)\)")


def _lock_holder(exc: BaseException) -> tuple[str | None, int | None] | None:
    """For DuckDB's error on a file locked by another process: (its program, its PID), as far as told; else None."""
    text = str(exc)
    if not isinstance(exc, duckdb.IOException) or not _LOCKED.search(text):
        return None
    found = _HOLDER.search(text)
    return (found["program"], int(found["pid"])) if found else (None, None)


#: DuckDB's magic, at byte 8 of every database file
DUCKDB_MAGIC = b"DUCK"
#: What a file that is no DuckDB database looks like, by its first bytes (checked in order)
_LOOKS = (
    (lambda head: head.startswith(b"PAR1"), "a Parquet file (modelvec export writes them)"),
    (lambda head: head.startswith(b"modelvec vectors"), "a modelvec vector file (name the store's .duckdb file)"),
    (lambda head: head.startswith(b"modelvec kept file"), "a file modelvec keeps beside a store"),
    (lambda head: head.startswith(b"SQLite format 3\0"), "an SQLite database"),
    (lambda head: head.startswith((b"PK\x03\x04", b"\x1f\x8b", b"\x28\xb5\x2f\xfd")), "a compressed archive"),
    (lambda head: head.lstrip()[:1] in (b"{", b"["), "a JSON file"),
)


def check_duckdb_file(path: Path) -> None:
    """Refuse an existing, non-empty file that is not a DuckDB database (no ``DUCK`` at byte 8), before DuckDB opens
    it: DuckDB opens a CSV or a Parquet file as an in-memory database of views over it, in which a store's writes
    vanish (and files were made beside it). A missing or empty file is a new store; what cannot be read is left to
    DuckDB to say."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(4096)
    except OSError:
        return
    if not head or head[8:12] == DUCKDB_MAGIC:
        return
    looks = next((words for test, words in _LOOKS if test(head)), None)
    if looks is None and _is_text(head):
        looks = "a CSV or text file"
    said = f": it looks like {looks}" if looks else ""
    raise StoreError(str(path), f"not a modelvec store (not a DuckDB database file){said}; it was left as it is")


def _is_text(head: bytes) -> bool:
    """Whether the first bytes of a file read as text (UTF-8 without control characters but tabs and line ends)."""
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:  # maybe a character cut at the end of the bytes read
        text = head[:-4].decode("utf-8", errors="replace")
        if "\ufffd" in text:
            return False
    return all(c.isprintable() or c in "\t\r\n" for c in text)


def connect(
    path: Path, wait: float, on_wait: Callable[[str], None] | None, *, read_only: bool = False
) -> duckdb.DuckDBPyConnection:
    """Open the DuckDB file, retrying while another process holds its lock, for at most ``wait`` seconds.

    Anything else that stops it (a file that is no DuckDB database, a truncated one, a read-only file system,
    a folder that cannot be written) is a :class:`StoreError` naming the file and the cause in a few words."""
    check_duckdb_file(path)
    start = time.monotonic()
    told = False
    while True:
        try:
            return duckdb.connect(str(path), read_only=read_only)
        except duckdb.Error as exc:
            holder = _lock_holder(exc)
            if holder is None:
                raise store_error(path, exc) from None
            waited = time.monotonic() - start
            if waited >= wait:
                raise StoreLockedError(path, holder[1], round(waited, 1)) from None
            if not told:
                who = f"PID {holder[1]}" if holder[1] is not None else "another process"
                limit = "for ever" if math.isinf(wait) else f"up to {wait:g} s"
                message = f"{path}: in use by another process ({who}); waiting for it to finish, {limit}"
                (on_wait or _log.warning)(message)
                told = True
            time.sleep(min(random.uniform(*_RETRY), max(0.0, wait - waited)))
