"""Reading checkpoints: which tensors play which role (architectures as data), and only those tensors.

Formats (safetensors, sharded safetensors, ``.bin``, PEFT LoRA adapters, GGUF) open through one
:func:`open_checkpoint`, with a registry of formats; no ``transformers`` model is ever built. The
tables import nothing heavy; the readers import torch, so they are loaded when first used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .architectures import ARCHITECTURES, Architecture, MatrixRef, Orientation, detect
from .formats import FORMATS, Format, format_of, open_checkpoint, refuse_adapter_base, register_format

if TYPE_CHECKING:
    from .checkpoint import Checkpoint, Layout, LowRankDelta, check_compatible

_LAZY = {
    "Checkpoint": "checkpoint",
    "Layout": "checkpoint",
    "LowRankDelta": "checkpoint",
    "check_compatible": "checkpoint",
}

__all__ = [
    "ARCHITECTURES",
    "Architecture",
    "FORMATS",
    "Format",
    "MatrixRef",
    "Orientation",
    "detect",
    "format_of",
    "open_checkpoint",
    "refuse_adapter_base",
    "register_format",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    """The torch-backed readers, imported on first use."""
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
