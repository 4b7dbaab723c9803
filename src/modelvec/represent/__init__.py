"""Representing a fine-tune as a vector: :class:`Representation` (the parameters) and :class:`DeltaEmbedder`.

The parameters import nothing heavy (the store and the command line use them); the estimator and
its linear algebra import torch, so they are loaded when first used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .params import FACTORS, POOLINGS, PROJECTIONS, SIGNS, SOLVERS, Representation

if TYPE_CHECKING:
    from .device import resolve_device
    from .embedder import BATCHINGS, Block, DeltaEmbedder, blocks_of, read_plan
    from .linalg import canonical_signs, factor_blocks, low_rank_svd, normalise_blocks, sketch_matrix, truncated_svd

_LAZY = {
    "BATCHINGS": "embedder",
    "Block": "embedder",
    "DeltaEmbedder": "embedder",
    "blocks_of": "embedder",
    "read_plan": "embedder",
    "resolve_device": "device",
    "canonical_signs": "linalg",
    "factor_blocks": "linalg",
    "low_rank_svd": "linalg",
    "normalise_blocks": "linalg",
    "sketch_matrix": "linalg",
    "truncated_svd": "linalg",
}

__all__ = ["FACTORS", "POOLINGS", "PROJECTIONS", "SIGNS", "SOLVERS", "Representation", *_LAZY]


def __getattr__(name: str) -> Any:
    """The torch-backed names, imported on first use."""
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
