"""The energy rank: the smallest r whose singular values carry a threshold of a matrix's energy (numpy only)."""

from __future__ import annotations

import numpy as np

DEFAULT_THRESHOLDS = (0.5, 0.9, 0.99)
_REACHED = 1e-9  # a threshold counts as reached within this relative margin (see modelvec.rank.study)


def energy_rank(singular_values: np.ndarray, threshold: float) -> int:
    """Smallest r with sum_{i<=r} s_i^2 >= threshold * sum s_i^2; 0 for a zero matrix."""
    if not 0 < threshold <= 1:
        raise ValueError(f"threshold must be in (0, 1], not {threshold}")
    energy = np.asarray(singular_values, dtype=np.float64) ** 2
    total = energy.sum()
    if total == 0:
        return 0
    cumulative = np.cumsum(energy) / total
    return int(np.searchsorted(cumulative, threshold * (1 - _REACHED), side="left") + 1)
