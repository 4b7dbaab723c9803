"""The safetensors header and its checks, with no I/O: the one parser of a local file's header (:mod:`modelvec.read`)
and of a Hub file's (:mod:`modelvec.hub`), which each get its bytes their own way.

safetensors is as strict (it stays the last word on a local file) but says "incomplete metadata, file not fully
covered" for a truncated file, and a Rust deserializer's dump for a bad field; what is wrong is said here in a few
words, the same words whichever way the bytes came. No length a header claims is ever allocated.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from .errors import HeaderFault, shown

__all__ = [
    "DTYPE_BITS",
    "MAX_HEADER",
    "HeaderFault",
    "check_length",
    "data_start",
    "header_length",
    "parse_header",
    "short_cause",
]

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
#: safetensors' own limit on a header's length; a larger length is corruption, never read.
MAX_HEADER = 100_000_000

#: Bits per element of each safetensors dtype (safetensors 0.8's list), to check a header's byte ranges.
DTYPE_BITS = {
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


def header_length(prefix: bytes | bytearray) -> int:
    """The header length a safetensors file's first 8 bytes give (a little-endian u64): the one place the prefix is
    decoded, whichever way its bytes came (a local file, a Hub file's first range)."""
    return int.from_bytes(prefix[:8], "little")


def data_start(prefix: bytes | bytearray, size: int) -> int:
    """Where the data of a file of ``size`` bytes that begins with ``prefix`` starts (8 + its header's length),
    checked by :func:`check_length`: a :class:`HeaderFault` where the file cannot hold that header."""
    length = header_length(prefix) if size >= 8 else 0
    check_length(size, length)
    return 8 + length


def check_length(size: int, length: int) -> None:
    """Raise :class:`HeaderFault` unless a file of ``size`` bytes can hold the header of ``length`` bytes its first 8
    bytes claim (``length`` is not looked at where the file is shorter than 8 bytes)."""
    if size < 8:
        raise HeaderFault(f"truncated ({size} bytes, too short for a safetensors header)")
    if length > MAX_HEADER:
        raise HeaderFault(f"corrupt (it claims a header of {length:,} bytes, over safetensors' 100 MB limit)")
    if length > size - 8:
        raise HeaderFault(f"truncated (its header claims {length:,} bytes, {size - 8:,} follow)")


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
    ("dtype", lambda v: isinstance(v, str) and v in DTYPE_BITS, "unknown dtype"),
    ("shape", lambda v: isinstance(v, list) and all(map(_size, v)), "shape is not a list of non-negative integers:"),
    (
        "data_offsets",
        lambda v: isinstance(v, list) and len(v) == 2 and all(map(_size, v)) and v[0] <= v[1],
        "data_offsets are not [begin, end] with begin <= end:",
    ),
)


def parse_header(text: bytes, data: int) -> dict[str, Any]:
    """The parsed header (tensor name -> dtype, shape and data_offsets relative to the data; ``__metadata__`` if any)
    of a file whose tensor data, after the header, is ``data`` bytes; :class:`HeaderFault` unless safetensors would
    accept it: JSON text of an object, each entry's fields sound, its offsets spanning its shape's bytes, and the
    tensors tiling the data exactly."""
    try:
        header = json.loads(text.decode("utf-8"))
    except UnicodeDecodeError:
        raise HeaderFault("header is not UTF-8 text") from None
    except ValueError as exc:
        raise HeaderFault(f"header is not valid JSON ({short_cause(exc)})") from None
    except RecursionError:
        raise HeaderFault("header is not valid JSON (nested too deeply)") from None
    if not isinstance(header, dict):
        raise HeaderFault("header is not a JSON object")
    metadata = header.get("__metadata__")
    if metadata is not None and not (isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())):
        raise HeaderFault("header's __metadata__ is not a map of strings")
    _check_tiling(_spans(header), data)
    return header


def _spans(header: dict[str, Any]) -> list[tuple[int, int, str]]:
    """Each tensor's data span [begin, end) and name, each entry checked."""
    spans = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(entry, dict):
            raise HeaderFault(
                f"header entry of tensor {shown(name)} is {shown(entry)}, not a dtype, shape and data_offsets"
            )
        for field, valid, problem in _ENTRY_FIELDS:
            if field not in entry:
                raise HeaderFault(f"header entry of tensor {shown(name)} has no {field}")
            if not valid(entry[field]):
                raise HeaderFault(f"header entry of tensor {shown(name)}: {problem} {shown(entry[field])}")
        (begin, end), need = entry["data_offsets"], _nbytes(entry["shape"], DTYPE_BITS[entry["dtype"]])
        if need != end - begin:
            size_of = "is too large or not whole bytes" if need is None else f"takes {need:,} bytes"
            raise HeaderFault(
                f"header entry of tensor {shown(name)}: shape {shown(entry['shape'])} of {entry['dtype']} "
                f"{size_of}, its data_offsets span {end - begin:,}"
            )
        spans.append((begin, end, name))
    return spans


def _check_tiling(spans: list[tuple[int, int, str]], data: int) -> None:
    """The tensors must tile the ``data`` bytes exactly, as safetensors requires."""
    covered, previous = 0, None
    for begin, end, name in sorted(spans):
        if begin != covered:
            beyond = next(((b, e, n) for b, e, n in spans if e > data), None)
            if beyond is not None:  # not a truncation: the tensors do not tile, and one lies past the end
                b, e, n = beyond
                raise HeaderFault(
                    f"header entry of tensor {shown(n)}: data_offsets [{b}, {e}] lie past the {data:,} bytes of data"
                )
            if begin < covered:
                raise HeaderFault(f"header entry of tensor {shown(name)} overlaps tensor {shown(previous)}")
            raise HeaderFault(f"header leaves data bytes {covered:,}-{begin:,} unused, before tensor {shown(name)}")
        covered, previous = end, name
    if covered > data:
        raise HeaderFault(f"truncated (its header claims {covered:,} bytes of tensors, the file has {data:,})")
    if covered < data:
        raise HeaderFault(f"corrupt ({data - covered:,} bytes follow the last tensor's data)")


def short_cause(exc: BaseException, limit: int = 160) -> str:
    """A third-party error as a short clause: its first line and sentence, without the Rust prefix or ANSI colours."""
    text = _ANSI.sub("", str(exc)).strip()
    text = text.splitlines()[0] if text else type(exc).__name__
    return shown(text.removeprefix("Error while deserializing header: ").split(". ")[0], limit)
