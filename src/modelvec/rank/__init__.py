"""The rank study: how the energy rank of every weight matrix (or of its fine-tuning delta) changes with depth.

``energy`` (the rule, numpy only) is imported at once; the study reads checkpoints with torch and is
imported when first used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .energy import DEFAULT_THRESHOLDS, energy_rank

if TYPE_CHECKING:
    from .study import (
        RankStudy,
        Spectrum,
        aggregate,
        fit_table,
        over_finetunes,
        over_stored,
        rank_study,
        rank_table,
        spectra,
    )

_STUDY = (
    "RankStudy",
    "Spectrum",
    "aggregate",
    "fit_table",
    "over_finetunes",
    "over_stored",
    "rank_study",
    "rank_table",
    "spectra",
)
__all__ = ["DEFAULT_THRESHOLDS", "energy_rank", *_STUDY]


def __getattr__(name: str) -> Any:
    """The study's names (torch), imported on first use."""
    if name in _STUDY:
        return getattr(importlib.import_module(".study", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
