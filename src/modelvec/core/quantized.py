"""Quantized safetensors checkpoints (GPTQ, AWQ, bitsandbytes): what the reader and the fetcher both know of them.

A folder is one where ``config.json``'s ``quantization_config.quant_method`` names a method read here, or where a
quantizer's own config file sits beside it (auto-gptq's ``quantize_config.json``, autoawq's ``quant_config.json``):
:func:`quant_config` gives that config, :func:`is_quantized` says whether a path is such a folder.

:func:`state_spans`: the tensors a reader needs before it can say which bytes it reads (a bitsandbytes 4-bit
weight's quantization state, a JSON that holds the matrix's shape): a partial download fetches them with the headers.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .files import CONFIG, QUANT_CONFIGS
from .safetensors import HeaderFault, data_start, parse_header

#: The methods read (``quantization_config.quant_method``).
METHODS = ("gptq", "awq", "bitsandbytes")
#: The name of a bitsandbytes 4-bit weight's quantization state (a JSON: quant_type, blocksize, dtype, shape...).
STATE = ".quant_state.bitsandbytes__"


def _json(path: Path) -> dict[str, Any] | None:
    try:
        if path.stat().st_size > 1 << 24:
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def quant_config(folder: Path) -> dict[str, Any] | None:
    """The quantization config of a folder (``quant_method`` set: gptq, awq or bitsandbytes), or None: config.json's
    ``quantization_config``, else auto-gptq's ``quantize_config.json`` (a GPTQ) or autoawq's ``quant_config.json`` (an
    AWQ; its ``w_bit``, ``q_group_size`` and ``version`` said as transformers says them)."""
    config = _json(folder / CONFIG) if (folder / CONFIG).is_file() else None
    inner = (config or {}).get("quantization_config")
    if isinstance(inner, dict) and str(inner.get("quant_method", "")).lower() in METHODS:
        return {**inner, "quant_method": str(inner["quant_method"]).lower()}
    for name, method in zip(QUANT_CONFIGS, ("gptq", "awq")):
        found = _json(folder / name) if (folder / name).is_file() else None
        if found is None:
            continue
        if method == "awq":
            found = {"bits": found.get("w_bit"), "group_size": found.get("q_group_size"), **found}
        return {**found, "quant_method": str(found.get("quant_method") or method).lower()}
    return None


def is_quantized(path: str | Path) -> bool:
    """A folder holding a GPTQ, AWQ or bitsandbytes checkpoint (by its config; the tensors are checked on opening)."""
    folder = Path(path)
    try:
        return folder.is_dir() and quant_config(folder) is not None
    except (OSError, ValueError):
        return False


def state_spans(header: dict[str, Any]) -> list[tuple[int, int]]:
    """The byte ranges, relative to the data start, of a safetensors header's quantization states (:data:`STATE`)."""
    spans = []
    for name, entry in header.items():
        if STATE in name and isinstance(entry, dict) and isinstance(entry.get("data_offsets"), list):
            begin, end = entry["data_offsets"]
            spans.append((int(begin), int(end)))
    return sorted(spans)


def file_states(path: Path) -> list[tuple[int, int]]:
    """The absolute byte ranges of a safetensors file's quantization states, from the header it holds (none where it
    is no safetensors file or its header is unsound: the reader says what is wrong with it)."""
    if path.suffix != ".safetensors":
        return []
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            start = data_start(fh.read(8), size)
            header = parse_header(fh.read(start - 8), size - start)
    except (OSError, HeaderFault):
        return []
    return [(start + a, start + b) for a, b in state_spans(header)]
