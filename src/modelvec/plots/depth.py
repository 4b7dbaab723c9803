"""The rank study's figure: each family's rank across depth, with its best-fitting law."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd

from .maps import PALETTE, write_atomically

#: Families in a fixed colour order, so the same family has the same colour in every figure.
FAMILY_ORDER = ("q", "k", "v", "o", "qkv", "ff_gate", "ff1", "ff2", "cross_q", "cross_k", "cross_v", "cross_o")
FAMILY_NAMES = {
    "q": "query Wq",
    "k": "key Wk",
    "v": "value Wv",
    "o": "output Wo",
    "qkv": "fused c_attn Wq|Wk|Wv",
    "ff_gate": "feed-forward gate",
    "ff1": "feed-forward W1",
    "ff2": "feed-forward W2",
    "cross_q": "cross-attn query",
    "cross_k": "cross-attn key",
    "cross_v": "cross-attn value",
    "cross_o": "cross-attn output",
}


def plot_rank(
    table: pd.DataFrame,
    fits: dict,
    threshold: float,
    path: str | os.PathLike,
    *,
    of: str = "weights",
    title: str = "",
    value: str = "rank",
) -> Path:
    """One line per family across layers at one threshold, each with its best-fitting law dashed.

    ``table`` has columns stack, layer (0-based), family, threshold and ``value`` (plus the quartiles
    ``rank_q25``/``rank_q75`` when it aggregates several models: drawn as a band, never outside the
    possible ranks). ``fits`` maps
    (stack, family, threshold) to fitted laws, best first (:func:`modelvec.spectra.tables.fit_depth_laws`).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    data = table[np.isclose(table["threshold"], threshold)]
    stacks = list(dict.fromkeys(data["stack"]))
    fig = Figure(figsize=(7.5 * len(stacks), 5.6), dpi=150, layout="constrained")  # every label inside
    FigureCanvasAgg(fig)
    matrix = "ΔW = W_ft − W_base" if of == "delta" else "W"
    banded = False
    for i, stack in enumerate(stacks):
        ax = fig.add_subplot(1, len(stacks), i + 1)
        part = data[data["stack"] == stack]
        families = sorted(
            part["family"].unique(), key=lambda f: (FAMILY_ORDER.index(f) if f in FAMILY_ORDER else 99, f)
        )
        for j, family in enumerate(families):
            rows = part[part["family"] == family].sort_values("layer")
            x = rows["layer"].to_numpy() + 1
            y = rows[value].to_numpy(dtype=float)
            color = PALETTE[j % len(PALETTE)]
            best = (fits.get((stack, family, float(threshold))) or [None])[0]
            law = (
                f" — {best.name.replace('_', ' ')}, adj. R² {best.adj_r2:.2f}"
                if best is not None and best.adj_r2 == best.adj_r2
                else ""
            )
            ax.plot(x, y, "o-", color=color, lw=1.6, ms=4, label=f"{FAMILY_NAMES.get(family, family)}{law}")
            if "rank_q25" in rows and (rows["rank_q75"] > rows["rank_q25"]).any():
                sides = np.array([min(int(v) for v in str(shape).split("x")) for shape in rows["shape"]], dtype=float)
                scale = 1.0 if value == "rank" else 1.0 / sides
                low = rows["rank_q25"].to_numpy(dtype=float) * scale
                high = rows["rank_q75"].to_numpy(dtype=float) * scale
                ax.fill_between(x, low, high, color=color, alpha=0.12, lw=0)  # the middle half of the models
                banded = True
            if law:
                grid = np.linspace(x.min(), x.max(), 200)
                ax.plot(grid, best.predict(grid), "--", color=color, lw=1, alpha=0.8)
        ax.set_xlabel(f"layer of the {stack} (1 = nearest the input)")
        what = "rank as a fraction of min(n, m)" if value == "rank_fraction" else "rank r"
        ax.set_ylabel(f"{what}: smallest r with Σᵢ≤ᵣ σᵢ² ≥ {threshold:g}·Σ σᵢ² of {matrix}")
        ax.set_title(stack, fontsize=10, loc="left")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, frameon=False, loc="best")
    if title:
        band = "; band: middle half of the models" if banded else ""  # one model has no band to explain
        text = f"{title} (threshold {threshold:g}; dashed: best fitted law{band})"
        fig.suptitle("\n".join(textwrap.wrap(text, width=int(80 * len(stacks)))), fontsize=11)
    return write_atomically(Path(path), lambda tmp: fig.savefig(tmp, format="png"))
