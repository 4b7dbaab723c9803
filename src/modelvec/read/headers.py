"""A local safetensors file's header, read and checked before ``safe_open`` so that a broken file gets a cause in
human terms (the format and its checks: :mod:`modelvec.core.safetensors`, shared with the Hub's range reads). Reads
8 bytes and the header, never more than safetensors' 100 MB limit, whatever length the file claims.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..core.safetensors import DTYPE_BITS, HeaderFault, data_start, parse_header, short_cause

__all__ = ["DTYPE_BITS", "HeaderFault", "header_of", "row_bytes", "safetensors_fault", "short_cause"]

_DTYPE_BITS = DTYPE_BITS  # the name the property tests know it by


def header_of(file: Path) -> tuple[int, dict[str, Any]]:
    """Where a safetensors file's data starts (8 + header length) and its parsed header (tensors -> dtype, shape,
    data_offsets relative to the data start; no ``__metadata__``), checked as safetensors would check it: a
    :class:`~modelvec.core.safetensors.HeaderFault` saying what is wrong otherwise."""
    try:
        with open(file, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            start = data_start(fh.read(8), size)
            text = fh.read(start - 8)
    except OSError as exc:
        raise HeaderFault(exc.strerror or short_cause(exc)) from None
    header = parse_header(text, size - start)
    header.pop("__metadata__", None)
    return start, header


def safetensors_fault(file: Path) -> str | None:
    """What is wrong with a safetensors file, in a few words, or None when its header is sound (:func:`header_of`)."""
    try:
        header_of(file)
    except HeaderFault as fault:
        return str(fault)
    return None


def row_bytes(entry: dict[str, Any], rows: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Byte ranges [start, stop), relative to the data start, of the given row ranges of a 2-D tensor's header entry."""
    begin, end = entry["data_offsets"]
    n_rows = entry["shape"][0] if entry["shape"] else 1
    per_row = (end - begin) // n_rows if n_rows else 0
    return [(begin + a * per_row, begin + b * per_row) for a, b in rows]
