"""The depth study: how the energy rank of every weight matrix (or of its fine-tuning delta) changes with depth.

For each stack, layer and family: all squared singular values (exact to float64, from the float64
Gram matrix's eigenvalues: see :mod:`modelvec.spectra.energy`), and r(t) = the smallest r with sum_{i<=r} s_i^2 / sum s_i^2 >= t, also as a fraction
of min(n, m). GPT-2's fused ``c_attn`` is studied both whole (family ``qkv``, as the original
gpt2-medium study did) and split into q, k, v.

Rules: the energies are summed in float64; a threshold counts as reached within a relative 1e-9
(so t = 1.0 gives the number of non-negligible singular values instead of depending on the last
bit of a float sum); a zero matrix has rank 0 at every threshold.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pandas as pd

from ..analyse.laws import Fit
from ..core.errors import CheckpointError, FetchError, IncompatibleError, ModelvecError, NothingStoredError
from ..read import open_checkpoint
from ..spectra.energy import DEFAULT_THRESHOLDS
from ..spectra.tables import Spectrum, aggregate_energy_ranks, energy_rank_table, fit_depth_laws
from .spectra import spectra_of

if TYPE_CHECKING:  # the store and the Hub only for a study over stored fine-tunes: one model's loads neither
    from ..store import Store

PathLike = str | os.PathLike[str]


@dataclass(kw_only=True)
class DepthStudy:
    """A depth study's table (every value), fitted laws and written files."""

    model: str
    of: str
    table: pd.DataFrame
    spectra: list[Spectrum]
    fits: dict[tuple[str, str, float], list[Fit]] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    n_models: int = 1  # fine-tunes aggregated (over_finetunes)
    failed: dict[str, str] = field(default_factory=dict)  # fine-tunes that could not be read: model -> reason
    warnings: list[str] = field(default_factory=list)  # e.g. the weights are quantized (report.rank records them)
    notes: list[str] = field(default_factory=list)  # what a study over stored models left out and why

    def records(self) -> list[dict]:
        return self.table.to_dict(orient="records")


def depth_study(
    model: PathLike,
    *,
    base: PathLike | None = None,
    of: str = "weights",
    thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
    device: str = "auto",
) -> DepthStudy:
    """The depth study of one model's weights, or of its delta to ``base``."""
    items = spectra_of(model, base=base, of=of, device=device)
    table = energy_rank_table(items, thresholds)
    return DepthStudy(model=str(model), of=of, table=table, spectra=items, fits=fit_depth_laws(table))


def over_finetunes(
    base: PathLike,
    models: Sequence[PathLike],
    *,
    thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
    device: str = "auto",
    name: str | None = None,
) -> tuple[DepthStudy, dict[str, str]]:
    """The depth study of the deltas of many fine-tunes of ``base``: mean and spread per family and layer.

    Returns the aggregated study and the models that failed (model -> reason); the others go on.
    ``name`` is how the base is shown (e.g. its Hub id when ``base`` is a cache folder).
    """
    base_ck = open_checkpoint(base)
    tables, failed, first = [], {}, None
    for model in models:
        try:
            items = spectra_of(model, base=base_ck, of="delta", device=device)
        except (CheckpointError, IncompatibleError) as exc:
            failed[str(model)] = str(exc)
            continue
        first = first or items
        tables.append(energy_rank_table(items, thresholds))
    if not tables:
        raise ValueError(f"{base}: none of the {len(models)} fine-tunes could be read")
    table = aggregate_energy_ranks(tables)
    study = DepthStudy(
        model=name or str(base),
        of="delta",
        table=table,
        spectra=[],
        fits=fit_depth_laws(table),
        n_models=len(tables),
        failed=failed,
    )
    return study, failed


def over_stored(
    base: str,
    *,
    store: Store | PathLike | None = None,
    thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
    device: str = "auto",
) -> DepthStudy:
    """The depth study of the deltas of every fine-tune of ``base`` in the store (``over_finetunes``).

    ``base`` is a local path or a Hub id as stored; Hub models are fetched at their stored
    revisions. A fine-tune that cannot be fetched or read is in ``study.failed``; the others go on.
    """
    from ..run import local_files
    from ..store import Population, opened
    from ..store.views.bases import stored_representation

    with opened(store, read_only=True) as db:  # the base's population: no copy, quantization or stale vector
        pop = Population(db, base, stored_representation(db, base))
        rows = dict(zip(pop.meta["model"], pop.meta["source"]))
        if not rows:
            raise NothingStoredError(str(base), "no stored fine-tunes of this base; embed some first")
        base_path = local_files(pop.name, "", db)
        models, unreadable = [], {}
        for m in sorted(rows):
            try:
                models.append(local_files(m, rows[m], db))
            except ModelvecError as exc:  # e.g. gone from the Hub and from the cache: the others go on
                unreadable[m] = str(exc)
    if not models:  # say why, not "none of 0"
        reason = next(iter(unreadable.values()))
        raise FetchError(str(base), f"none of its {len(rows)} stored fine-tunes could be fetched; the first: {reason}")
    study, failed = over_finetunes(
        base_path, models, thresholds=thresholds, device=device, name=None if base_path == pop.name else pop.name
    )
    study.failed = {**unreadable, **failed}
    study.notes = pop.left_out()
    return study
