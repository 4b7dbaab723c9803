"""Reading checkpoints: which tensors play which role (architectures as data), and only those tensors.

Formats (safetensors, sharded safetensors, ``.bin``, PEFT LoRA adapters, GGUF) open through one
:func:`open_checkpoint`, with a registry of formats; no ``transformers`` model is ever built. The
tables import nothing heavy; the readers import torch, so they are loaded when first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.lazy import lazy_exports
from .architectures import ARCHITECTURES, detect
from .formats import (
    FORMATS,
    Format,
    adapter_parent,
    format_of,
    open_checkpoint,
    refuse_adapter_base,
    register_format,
)
from .roles import Architecture, MatrixRef, Orientation, VocabularyHead

if TYPE_CHECKING:
    from .checkpoint import Checkpoint, LowRankDelta
    from .layout import Layout, check_compatible

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {"checkpoint": ("Checkpoint", "LowRankDelta"), "layout": ("Layout", "check_compatible")},
    eager=(
        "ARCHITECTURES",
        "Architecture",
        "FORMATS",
        "Format",
        "MatrixRef",
        "Orientation",
        "adapter_parent",
        "VocabularyHead",
        "detect",
        "format_of",
        "open_checkpoint",
        "refuse_adapter_base",
        "register_format",
    ),
)
