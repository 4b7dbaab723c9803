"""The safetensors header, checked before ``safe_open`` so that a broken file gets a cause in human terms.

safetensors is as strict (it stays the last word) but says "incomplete metadata, file not fully
covered" for a truncated file, and a Rust deserializer's dump for a bad field. Reading 8 bytes and
the header, never more than safetensors' 100 MB limit, whatever length the file claims.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..core.errors import shown

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_MAX_HEADER = 100_000_000  # safetensors' own limit on a header; a larger length is corruption, never allocated

# Bits per element of each safetensors dtype (safetensors 0.8's list), to check a header's byte ranges.
_DTYPE_BITS = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "I64": 64,
    "U64": 64,
    "F64": 64,
    "C64": 64,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
}


def _size(value: Any) -> bool:
    """A JSON value that safetensors reads as a usize."""
    return type(value) is int and 0 <= value < 1 << 64


def _nbytes(shape: list[int], bits: int) -> int | None:
    """The bytes a tensor takes, or None where safetensors' usize arithmetic overflows (and so it refuses the file).

    Multiplied in order with the same overflow test, and bounded: a hostile shape of millions
    of huge dimensions never grows a huge integer.
    """
    total = 1
    for dim in [*shape, bits]:
        total *= dim
        if total >= 1 << 64:
            return None
    return total // 8 if total % 8 == 0 else None


# What each tensor entry of a safetensors header must hold, and how to say that it does not.
_ENTRY_FIELDS: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    ("dtype", lambda v: isinstance(v, str) and v in _DTYPE_BITS, "unknown dtype"),
    ("shape", lambda v: isinstance(v, list) and all(map(_size, v)), "shape is not a list of non-negative integers:"),
    (
        "data_offsets",
        lambda v: isinstance(v, list) and len(v) == 2 and all(map(_size, v)) and v[0] <= v[1],
        "data_offsets are not [begin, end] with begin <= end:",
    ),
)


def safetensors_fault(file: Path) -> str | None:
    """What is wrong with a safetensors file, in a few words, or None when its header is sound.

    Checked here, before ``safe_open``, for the cause in human terms: safetensors is as strict
    (it stays the last word) but says "incomplete metadata, file not fully covered" for a
    truncated file, and a Rust deserializer's dump for a bad field. Reads 8 bytes and the
    header, never more than safetensors' 100 MB limit, whatever length the file claims.
    """
    try:
        with open(file, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size < 8:
                return f"truncated ({size} bytes, too short for a safetensors header)"
            length = int.from_bytes(fh.read(8), "little")
            if length > _MAX_HEADER:
                return f"corrupt (it claims a header of {length:,} bytes, over safetensors' 100 MB limit)"
            if length > size - 8:
                return f"truncated (its header claims {length:,} bytes, {size - 8:,} follow)"
            raw = fh.read(length)
    except OSError as exc:
        return exc.strerror or short_cause(exc)
    try:
        header = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return "header is not UTF-8 text"
    except ValueError as exc:
        return f"header is not valid JSON ({short_cause(exc)})"
    except RecursionError:
        return "header is not valid JSON (nested too deeply)"
    if not isinstance(header, dict):
        return "header is not a JSON object"
    metadata = header.pop("__metadata__", None)
    if metadata is not None and not (isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())):
        return "header's __metadata__ is not a map of strings"
    spans = []
    for name, entry in header.items():
        if not isinstance(entry, dict):
            return f"header entry of tensor {shown(name)} is {shown(entry)}, not a dtype, shape and data_offsets"
        for field, valid, problem in _ENTRY_FIELDS:
            if field not in entry:
                return f"header entry of tensor {shown(name)} has no {field}"
            if not valid(entry[field]):
                return f"header entry of tensor {shown(name)}: {problem} {shown(entry[field])}"
        (begin, end), need = entry["data_offsets"], _nbytes(entry["shape"], _DTYPE_BITS[entry["dtype"]])
        if need != end - begin:
            size_of = "is too large or not whole bytes" if need is None else f"takes {need:,} bytes"
            return (
                f"header entry of tensor {shown(name)}: shape {shown(entry['shape'])} of {entry['dtype']} "
                f"{size_of}, its data_offsets span {end - begin:,}"
            )
        spans.append((begin, end, name))
    data = size - 8 - length
    covered, previous = 0, None
    for begin, end, name in sorted(spans):  # the tensors must tile the data exactly, as safetensors requires
        if begin != covered:
            beyond = next(((b, e, n) for b, e, n in spans if e > data), None)
            if beyond is not None:  # not a truncation: the tensors do not tile, and one lies past the end
                b, e, n = beyond
                return f"header entry of tensor {shown(n)}: data_offsets [{b}, {e}] lie past the {data:,} bytes of data"
            if begin < covered:
                return f"header entry of tensor {shown(name)} overlaps tensor {shown(previous)}"
            return f"header leaves data bytes {covered:,}-{begin:,} unused, before tensor {shown(name)}"
        covered, previous = end, name
    if covered > data:
        return f"truncated (its tensors need {covered:,} bytes of data, {data:,} are there)"
    if covered < data:
        return f"corrupt ({data - covered:,} bytes follow the last tensor's data)"
    return None


def header_of(file: Path) -> tuple[int, dict[str, Any]]:
    """Where a safetensors file's data starts (8 + header length) and its parsed header (tensors -> dtype,
    shape, data_offsets relative to the data start); for a file :func:`safetensors_fault` found sound."""
    with open(file, "rb") as fh:
        length = int.from_bytes(fh.read(8), "little")
        header = json.loads(fh.read(length).decode("utf-8"))
    header.pop("__metadata__", None)
    return 8 + length, header


def row_bytes(entry: dict[str, Any], rows: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Byte ranges [start, stop), relative to the data start, of the given row ranges of a 2-D tensor's header entry."""
    begin, end = entry["data_offsets"]
    n_rows = entry["shape"][0] if entry["shape"] else 1
    per_row = (end - begin) // n_rows if n_rows else 0
    return [(begin + a * per_row, begin + b * per_row) for a, b in rows]


def short_cause(exc: BaseException, limit: int = 160) -> str:
    """A third-party error as a short clause: its first line and sentence, without the Rust prefix or ANSI colours."""
    text = _ANSI.sub("", str(exc)).strip()
    text = text.splitlines()[0] if text else type(exc).__name__
    return shown(text.removeprefix("Error while deserializing header: ").split(". ")[0], limit)
