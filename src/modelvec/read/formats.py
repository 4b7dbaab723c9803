"""Every checkpoint format behind one :func:`open_checkpoint`, through a registry of formats.

A format is a cheap test on the path (a ``.gguf`` name, an ``adapter_config.json`` without full
weights) and the reader class that opens it, named as ``"module:Class"`` and imported only when a
path of that format is opened: the base reader (:mod:`modelvec.read.checkpoint`) never imports
its extensions, and an optional dependency (``gguf``) is imported only for its files. The first
format whose test accepts the path opens it; plain weights (safetensors or ``.bin``) come last.
Adding a format is :func:`register_format`.
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..core.errors import CheckpointError
from ..core.files import ADAPTER_CONFIG, is_adapter, is_gguf
from ..core.quantized import is_quantized

if TYPE_CHECKING:
    from .checkpoint import Checkpoint

PathLike = str | os.PathLike[str]


@dataclass(frozen=True)
class Format:
    """One checkpoint format: ``claims(path)`` says whether a path is one; ``reader`` opens it."""

    name: str
    claims: Callable[[Path], bool]
    reader: str  # "package.module:Class", imported on first use

    def open(self, path: PathLike, name: str | None = None) -> Checkpoint:
        module, _, cls = self.reader.partition(":")
        reader: type[Checkpoint] = getattr(importlib.import_module(module), cls)
        return reader(path, name)


FORMATS: list[Format] = [
    Format("gguf", is_gguf, "modelvec.read.gguf:GGUFCheckpoint"),
    Format("peft-lora", is_adapter, "modelvec.read.adapters:AdapterCheckpoint"),
    Format("quantized", is_quantized, "modelvec.read.quantized:QuantizedCheckpoint"),  # GPTQ, AWQ, bitsandbytes
    Format("weights", lambda _path: True, "modelvec.read.checkpoint:Checkpoint"),
]


def register_format(fmt: Format) -> None:
    """Add a format, tried before the built-in ones (a later registration of the same name replaces it)."""
    FORMATS[:] = [fmt, *(f for f in FORMATS if f.name != fmt.name)]


def format_of(path: PathLike) -> Format:
    """The format that reads ``path``."""
    return next(f for f in FORMATS if f.claims(Path(path)))


def open_checkpoint(path: PathLike, name: str | None = None) -> Checkpoint:
    """The reader for any model modelvec accepts: a GGUF file, a PEFT adapter folder, a GPTQ, AWQ or bitsandbytes
    folder, or weights."""
    return format_of(path).open(path, name)


def adapter_parent(path: PathLike) -> str | None:
    """The model a PEFT adapter folder says it adapts (``base_model_name_or_path``), None if it says none."""
    try:
        adapts = json.loads((Path(path) / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
    except (OSError, ValueError, AttributeError):
        return None
    return adapts if isinstance(adapts, str) and adapts else None


def refuse_adapter_base(path: PathLike, name: str | None = None) -> None:
    """Raise if ``path`` is a PEFT adapter given as a base: a delta has no weights to take deltas from.

    The error names the model the adapter says it adapts, the base the user most likely meant.
    """
    if not is_adapter(Path(path)):
        return
    adapts = adapter_parent(path)
    said = f" ({ADAPTER_CONFIG} names {adapts})" if adapts else ""
    raise CheckpointError(
        name or str(path), f"is a LoRA adapter, not a base model: use the model it adapts as the base{said}"
    )
