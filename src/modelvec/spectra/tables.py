"""Energy ranks from spectra: the table of every value, their spread over many models, laws fitted across depth.

Arrays and frames in, numbers out: what the depth study computes once the squared singular values of
each matrix are known (:mod:`modelvec.spectra.energy`; reading checkpoints is :mod:`modelvec.studies.depth`'s).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..analyse.laws import Fit, fit_laws
from .energy import DEFAULT_THRESHOLDS, rank_of_energies


@dataclass(frozen=True)
class Spectrum:
    """The squared singular values σᵢ² (descending, float64, exact to float64) of one matrix in
    W in R^{in x out} orientation; ``singular_values`` their square roots."""

    stack: str
    layer: int
    family: str
    shape: tuple[int, int]
    energies: np.ndarray = field(repr=False)

    @property
    def singular_values(self) -> np.ndarray:
        return np.sqrt(self.energies)


def energy_rank_table(items: Sequence[Spectrum], thresholds: Sequence[float] = DEFAULT_THRESHOLDS) -> pd.DataFrame:
    """One record per matrix and threshold: stack, layer, family, shape, n, m, threshold, rank, rank_fraction."""
    rows = []
    for sp in items:
        n, m = sp.shape
        for t in thresholds:
            r = rank_of_energies(sp.energies, t)
            rows.append(
                {
                    "stack": sp.stack,
                    "layer": sp.layer,
                    "family": sp.family,
                    "shape": f"{n}x{m}",
                    "n": n,
                    "m": m,
                    "threshold": float(t),
                    "rank": r,
                    "rank_fraction": r / min(n, m),
                }
            )
    return pd.DataFrame(rows)


def aggregate_energy_ranks(tables: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """Mean and spread of the ranks of many models, per stack, family, layer and threshold: std, min, max
    and the quartiles (the figure's band: quantiles stay within the possible ranks, mean ± std need not)."""
    data = pd.concat(tables, ignore_index=True)
    keys = ["stack", "family", "layer", "shape", "threshold"]
    grouped = data.groupby(keys, sort=False)
    out = grouped.agg(
        rank=("rank", "mean"),
        rank_std=("rank", "std"),
        rank_min=("rank", "min"),
        rank_max=("rank", "max"),
        rank_q25=("rank", lambda r: float(r.quantile(0.25))),
        rank_q75=("rank", lambda r: float(r.quantile(0.75))),
        rank_fraction=("rank_fraction", "mean"),
        models=("rank", "size"),
    ).reset_index()
    return out.fillna({"rank_std": 0.0})


def fit_depth_laws(table: pd.DataFrame, *, value: str = "rank") -> dict[tuple[str, str, float], list[Fit]]:
    """Candidate laws fitted per (stack, family, threshold) across depth, best first (``laws.fit_laws``)."""
    fits = {}
    for (stack, family, threshold), group in table.groupby(["stack", "family", "threshold"], sort=False):
        group = group.sort_values("layer")
        x = group["layer"].to_numpy(dtype=float) + 1
        depth = float(table.loc[table["stack"] == stack, "layer"].max() + 1)
        fits[(stack, family, float(threshold))] = fit_laws(x, group[value].to_numpy(dtype=float), depth=depth)
    return fits


def ranks_across_depth(table: pd.DataFrame, *, value: str = "rank") -> dict[tuple[str, str, float], list[float | None]]:
    """``value`` per (stack, family, threshold) at layers 1..L of its stack, in order; None where the
    family has no matrix at that layer (L: the stack's deepest layer in ``table``)."""
    out: dict[tuple[str, str, float], list[float | None]] = {}
    depths = table.groupby("stack", sort=False)["layer"].max()
    for (stack, family, threshold), group in table.groupby(["stack", "family", "threshold"], sort=False):
        at = dict(zip(group["layer"].astype(int), group[value].astype(float)))
        out[(stack, family, float(threshold))] = [at.get(layer) for layer in range(int(depths[stack]) + 1)]
    return out
