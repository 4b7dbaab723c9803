"""A GGUF file's layout from its first bytes, and which of a repository's GGUF files is read.

:func:`header_extent` walks a GGUF header (version 2 or 3: magic, counts, metadata, tensor table) in a buffer that may
hold only its start, and says where the tensors' data begins, or how many bytes it needs to say so: what reading a
remote GGUF by byte ranges needs (the metadata can be megabytes: the tokenizer's vocabulary sits in it). The tensor
table is checked against the file's size (every tensor's first byte inside the data). The tensors themselves are
read by the ``gguf`` package (:mod:`modelvec.read.gguf`) from the file the ranges were written into.

:func:`gguf_weights`: a repository often holds one model in many quantizations (``Q2_K`` ... ``F16``, each a file or a
set of split files, ``-00001-of-00003.gguf``); the one read is the finest (the most bits a weight, from the type in
its name), the one nearest the model it rounds.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterable
from dataclasses import dataclass

from .errors import GGUFFault, NeedMore

__all__ = ["GGUFExtent", "GGUFFault", "NeedMore", "gguf_weights", "header_extent", "split_parts"]

MAGIC = b"GGUF"
#: The data's alignment where ``general.alignment`` does not say (llama.cpp's ``GGUF_DEFAULT_ALIGNMENT``).
ALIGNMENT = 32
#: Bytes of each fixed-size metadata value type (GGUF's ``GGUFValueType``); 8 is a string, 9 an array.
_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9
#: Bytes beyond an array's estimated end asked for with it: the metadata after the vocabulary and the tensor table
#: (a 7B Llama's 291 tensors: about 20 KB).
_SLACK = 1 << 16
#: A split file's name: its stem, its part and the number of parts.
SPLIT = re.compile(r"(?P<stem>.+)-(?P<part>\d{5})-of-(?P<parts>\d{5})\.gguf", re.IGNORECASE)


@dataclass(frozen=True)
class GGUFExtent:
    """Where a GGUF file's parts lie: its tensors' data begins at ``data_start`` (the header's length, padding
    included); ``tensors``: each tensor's name and its offset within the data."""

    version: int
    data_start: int
    tensors: tuple[tuple[str, int], ...]


class _Cursor:
    def __init__(self, buffer: bytes | bytearray | memoryview) -> None:
        self.buffer, self.at = memoryview(buffer), 0

    def take(self, n: int) -> memoryview:
        if self.at + n > len(self.buffer):
            raise NeedMore(self.at + n)
        out = self.buffer[self.at : self.at + n]
        self.at += n
        return out

    def u32(self) -> int:
        return int(struct.unpack("<I", self.take(4))[0])

    def u64(self) -> int:
        return int(struct.unpack("<Q", self.take(8))[0])

    def string(self, limit: int) -> bytes:
        n = self.u64()
        if n > limit:
            raise GGUFFault(f"a string of {n:,} bytes in a file of {limit:,}")
        return bytes(self.take(n))

    def skip(self, kind: int, limit: int, depth: int = 0) -> int | None:
        """Step over one value of type ``kind``; a u32 is returned (``general.alignment``)."""
        if kind in _SIZES:
            raw = self.take(_SIZES[kind])
            return int(struct.unpack("<I", raw)[0]) if kind == 4 else None
        if kind == _STRING:
            self.string(limit)
            return None
        if kind != _ARRAY or depth > 4:
            raise GGUFFault(f"unknown metadata type {kind}")
        inner, count = self.u32(), self.u64()
        if count > limit:
            raise GGUFFault(f"an array of {count:,} values in a file of {limit:,} bytes")
        if inner in _SIZES:
            self.take(_SIZES[inner] * count)
            return None
        start = self.at
        for i in range(count):
            try:
                self.skip(inner, limit, depth + 1)
            except NeedMore as more:  # the rest of the array at the mean length of its values so far
                raise NeedMore(more.size, start + (self.at - start) * count // max(i, 1) + _SLACK) from None
        return None


def header_extent(buffer: bytes | bytearray | memoryview, size: int) -> GGUFExtent:
    """The layout of a GGUF file of ``size`` bytes whose first bytes are ``buffer``; :class:`NeedMore` where the
    buffer ends inside the header, :class:`GGUFFault` where the bytes are no GGUF header this file can have."""
    cur = _Cursor(buffer)
    if bytes(cur.take(4)) != MAGIC:
        raise GGUFFault("not a GGUF file (no GGUF magic)")
    version = cur.u32()
    if version not in (2, 3):
        raise GGUFFault(f"GGUF version {version} (read: 2 and 3)")
    n_tensors, n_kv = cur.u64(), cur.u64()
    if n_tensors > size or n_kv > size:
        raise GGUFFault(f"its header counts {n_tensors:,} tensors and {n_kv:,} metadata keys in {size:,} bytes")
    alignment = ALIGNMENT
    for _ in range(n_kv):
        key = cur.string(size)
        value = cur.skip(cur.u32(), size)
        if key == b"general.alignment" and value is not None:
            alignment = value
    if alignment <= 0 or alignment & (alignment - 1):
        raise GGUFFault(f"general.alignment {alignment} is not a power of two")
    tensors = []
    for _ in range(n_tensors):
        name = cur.string(size).decode("utf-8", "replace")
        dims = cur.u32()
        if dims > 8:
            raise GGUFFault(f"tensor {name[:60]!r} has {dims} dimensions")
        cur.take(8 * dims)
        cur.u32()  # its type
        tensors.append((name, cur.u64()))
    start = cur.at + (-cur.at % alignment)
    if start > size:
        raise GGUFFault(f"truncated: its header ends at byte {start:,} of {size:,}")
    for name, offset in tensors:
        if offset % alignment or start + offset >= size:
            raise GGUFFault(f"its tensor table puts {name[:60]!r} at byte {start + offset:,} of {size:,}")
    return GGUFExtent(version, start, tuple(tensors))


def _bits(name: str) -> float:
    """Bits a weight of the quantization type named in a file's name (0 where it names none known)."""
    try:
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    except ImportError:  # pragma: no cover - the gguf package is a dependency of the GGUF reader
        return 0.0
    upper = name.upper()
    found = [t for t in GGMLQuantizationType if re.search(rf"(?<![A-Z0-9]){t.name}(?![0-9])", upper)]
    if not found:
        return 0.0
    block, nbytes = GGML_QUANT_SIZES[max(found, key=lambda t: len(t.name))]
    return 8.0 * nbytes / block


def gguf_weights(files: Iterable[str]) -> list[str] | None:
    """The GGUF file (or the parts of a split one, in order) of a repository that is read: the finest of its
    quantizations (ties: the first by name); None where it has no top-level ``.gguf`` file."""
    groups: dict[str, list[str]] = {}
    for name in sorted(f for f in files if "/" not in f and f.lower().endswith(".gguf")):
        split = SPLIT.fullmatch(name)
        groups.setdefault(split.group("stem") if split else name, []).append(name)
    if not groups:
        return None
    best = max(sorted(groups), key=lambda stem: _bits(stem))
    return groups[best]


def split_parts(names: Iterable[str]) -> tuple[int, int] | None:
    """How many parts of a split GGUF ``names`` holds and how many it says there are (None: not split)."""
    matched = [m for m in (SPLIT.fullmatch(n) for n in names) if m is not None]
    if not matched:
        return None
    return len({m.group("part") for m in matched}), int(matched[0].group("parts"))
