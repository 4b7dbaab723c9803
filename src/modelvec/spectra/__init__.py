"""Spectra and energy ranks, from arrays: the mathematics of the depth study (``modelvec rank``).

``energy``: the squared singular values of matrices (exact to float64) and the energy rank of a threshold;
``tables``: the table of every value, its spread over models, and laws fitted across depth. Reading
checkpoints and stores is :mod:`modelvec.studies.depth`'s.
"""

from __future__ import annotations

from .energy import DEFAULT_THRESHOLDS, energy_rank, gram_energies, rank_of_energies
from .tables import Spectrum, aggregate_energy_ranks, energy_rank_table, fit_depth_laws

__all__ = [
    "DEFAULT_THRESHOLDS",
    "Spectrum",
    "aggregate_energy_ranks",
    "energy_rank",
    "energy_rank_table",
    "fit_depth_laws",
    "gram_energies",
    "rank_of_energies",
]
