"""Representing a fine-tune as a vector: :class:`Representation` (the parameters) and :class:`DeltaEmbedder`.

The parameters import nothing heavy (the store and the command line use them); the estimator and
its linear algebra import torch, so they are loaded when first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.lazy import lazy_exports
from .representation import FACTORS, POOLINGS, PROJECTIONS, SIGNS, SOLVERS, Representation

if TYPE_CHECKING:
    from .blocks import Block, blocks_of, read_plan
    from .device import resolve_device
    from .embedder import BATCHINGS, DeltaEmbedder
    from .linalg import canonical_signs, factor_blocks, low_rank_svd, normalise_blocks, sketch_matrix, truncated_svd

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "device": ("resolve_device",),
        "blocks": ("Block", "blocks_of", "read_plan"),
        "embedder": ("BATCHINGS", "DeltaEmbedder"),
        "linalg": (
            "canonical_signs",
            "factor_blocks",
            "low_rank_svd",
            "normalise_blocks",
            "sketch_matrix",
            "truncated_svd",
        ),
    },
    eager=("FACTORS", "POOLINGS", "PROJECTIONS", "SIGNS", "SOLVERS", "Representation"),
)
