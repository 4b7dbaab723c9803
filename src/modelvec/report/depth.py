"""The depth study (``modelvec rank``) written out: every value as CSV and JSON, one figure per threshold, and its warnings."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..analyse.laws import MIN_ADJ_R2, Fit, shown_law
from ..core.lazy import warm
from ..core.names import display_name, is_hub_id
from ..core.output import json_text, write_atomically
from ..core.settings import with_options
from ..plots.depth import plot_rank
from ..read.checkpoint import QuantizationWarning
from ..spectra.energy import Ranks
from ..studies.depth import DepthStudy, depth_study, over_stored

if TYPE_CHECKING:
    from ..store import Store

PathLike = str | os.PathLike[str]


def write_outputs(study: DepthStudy, out: PathLike, title: str) -> None:
    """CSV and JSON of every value, and one figure per threshold with the best laws drawn where they fit.

    The JSON's ``laws`` hold every fitted law, best first, and which one a report shows (``shown``: its name,
    or null) with what it says (``verdict``): shown only where its adjusted R² ≥ ``min_adj_r2``."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    write_atomically(folder / "ranks.csv", lambda tmp: study.table.to_csv(tmp, index=False))  # never half a file
    study.files["csv"] = str(folder / "ranks.csv")
    payload = {
        "model": study.model,
        "of": study.of,
        "records": study.records(),
        "singular_values": [
            {
                "stack": s.stack,
                "layer": s.layer,
                "family": s.family,
                "shape": list(s.shape),
                "values": s.singular_values.tolist(),
            }
            for s in study.spectra
        ],
        "min_adj_r2": MIN_ADJ_R2,
        "laws": [_laws_entry(key, fits) for key, fits in study.fits.items()],
    }
    text = json_text(payload)  # strict: a law's undefined R² is null, not NaN
    write_atomically(folder / "ranks.json", lambda tmp: Path(tmp).write_text(text))
    study.files["json"] = str(folder / "ranks.json")
    for threshold in sorted(study.table["threshold"].unique()):
        path = folder / f"rank-{threshold:g}.png"
        plot_rank(study.table, study.fits, float(threshold), path, of=study.of, title=title)
        study.files[f"png {threshold:g}"] = str(path)


def _laws_entry(key: tuple[str, str, float], fits: list[Fit]) -> dict:
    """Every law fitted to one (stack, family, threshold), best first, and the one shown (or null) with its verdict."""
    law, verdict = shown_law(fits)
    return {
        "stack": key[0],
        "family": key[1],
        "threshold": key[2],
        "shown": law.name if law is not None else None,
        "verdict": verdict,
        "fits": [
            {
                "law": f.name,
                "equation": f.equation,
                "params": f.coefficients,
                "r2": f.r2,
                "adj_r2": f.adj_r2,
                "aic": f.aic,
            }
            for f in fits
        ],
    }


def depth_report(
    model: PathLike | None = None,
    ranks: Ranks | None = None,
    *,
    base: PathLike | None = None,
    over_finetunes: str | None = None,
    store: Store | PathLike | None = None,
    out: PathLike | None = None,
    device: str = "auto",
    **options: Any,
) -> DepthStudy:
    """The depth study of ``model`` (its weights, or with ``of="delta"`` its delta to ``base``), or of the
    deltas of every stored fine-tune of ``over_finetunes``; written to ``out`` when given. ``ranks`` says which
    (:class:`~modelvec.spectra.energy.Ranks`; its settings may also be given one by one: ``thresholds=(0.9,)``).

    A quantized checkpoint's warning (GGUF, GPTQ, AWQ, bitsandbytes) is kept in ``study.warnings`` (the ranks include quantization noise).
    """
    ranks = with_options(Ranks, ranks, options, "depth_report")
    of, thresholds = ranks.of, ranks.thresholds
    if over_finetunes is not None and model is not None:
        raise ValueError(f"give a MODEL ({model}) or --over-finetunes BASE ({over_finetunes}), not both")
    if out is not None:  # what the figures and laws import, loaded while the spectra are computed
        warm("matplotlib.figure", "matplotlib.backends.backend_agg", "scipy.optimize")
    if over_finetunes is not None:
        study = over_stored(over_finetunes, store=store, thresholds=thresholds, device=device)
        shown = study.model if is_hub_id(study.model) else display_name(study.model)
        title = f"{study.n_models} fine-tunes of {shown}: mean rank of ΔW across depth"
    elif model is None:
        raise ValueError("give a MODEL, or --over-finetunes BASE")
    else:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", QuantizationWarning)
            study = depth_study(model, base=base, of=of, thresholds=thresholds, device=device)
        for w in caught:
            if issubclass(w.category, QuantizationWarning):
                study.warnings.append(str(w.message))
            else:
                warnings.showwarning(w.message, w.category, w.filename, w.lineno)
        title = f"{display_name(model)}: rank of {'ΔW' if of == 'delta' else 'W'} across depth"
    if out is not None:
        write_outputs(study, out, title)
    return study
