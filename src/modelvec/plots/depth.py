"""The rank study's figure: each family's rank across depth, with its best-fitting law where one fits."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ..analyse.laws import MIN_ADJ_R2, shown_law
from ..core.output import write_atomically
from .maps import PALETTE
from .text import figure_text

if TYPE_CHECKING:
    from matplotlib.figure import Figure

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


def rank_figure(
    table: pd.DataFrame,
    fits: dict,
    threshold: float,
    *,
    of: str = "weights",
    title: str = "",
    value: str = "rank",
    min_adj_r2: float = MIN_ADJ_R2,
) -> Figure:
    """One line per family across layers at one threshold; its law dashed only where one fits.

    ``table`` has columns stack, layer (0-based), family, threshold and ``value`` (plus the quartiles
    ``rank_q25``/``rank_q75`` when it aggregates several models: drawn as a band, never outside the
    possible ranks). ``fits`` maps (stack, family, threshold) to fitted laws, best first
    (:func:`modelvec.spectra.tables.fit_depth_laws`). A law is drawn (dashed, labelled ``_law <family>``)
    only when :func:`modelvec.analyse.laws.shown_law` shows it: its adjusted R² is defined and at
    least ``min_adj_r2``; never a law below it, nor a nan one. The caption says so.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    data = table[np.isclose(table["threshold"], threshold)]
    stacks = list(dict.fromkeys(data["stack"]))
    fig = Figure(figsize=(7.5 * max(len(stacks), 1), 5.6), dpi=150, layout="constrained")  # every label inside
    FigureCanvasAgg(fig)
    matrix = "ΔW = W_ft − W_base" if of == "delta" else "W"
    banded = drawn = False
    verdicts = []  # what each family's law is, for the caption
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
            law, verdict = shown_law(fits.get((stack, family, float(threshold))) or [], min_adj_r2=min_adj_r2)
            verdicts.append(verdict)
            named = f" — {law.name.replace('_', ' ')}, adj. R² {law.adj_r2:.2f}" if law is not None else ""
            ax.plot(x, y, "o-", color=color, lw=1.6, ms=4, label=f"{FAMILY_NAMES.get(family, family)}{named}")
            if "rank_q25" in rows and (rows["rank_q75"] > rows["rank_q25"]).any():
                sides = np.array([min(int(v) for v in str(shape).split("x")) for shape in rows["shape"]], dtype=float)
                scale = 1.0 if value == "rank" else 1.0 / sides
                low = rows["rank_q25"].to_numpy(dtype=float) * scale
                high = rows["rank_q75"].to_numpy(dtype=float) * scale
                ax.fill_between(x, low, high, color=color, alpha=0.12, lw=0)  # the middle half of the models
                banded = True
            if law is not None:
                grid = np.linspace(x.min(), x.max(), 200)
                ax.plot(grid, law.predict(grid), "--", color=color, lw=1, alpha=0.8, label=f"_law {family}")
                drawn = True
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # layers: 1, 2, …, never 1.5
        ax.set_xlabel(f"layer of the {stack} (1 = nearest the input)")
        what = "rank as a fraction of min(n, m)" if value == "rank_fraction" else "rank r"
        ax.set_ylabel(f"{what}: smallest r with Σᵢ≤ᵣ σᵢ² ≥ {threshold:g}·Σ σᵢ² of {matrix}")
        ax.set_title(stack, fontsize=10, loc="left")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, frameon=False, loc="best")
    band = "; band: middle half of the models" if banded else ""  # one model has no band to explain
    if drawn:
        laws = f"dashed: the best fitted law, drawn only where its adjusted R² ≥ {min_adj_r2:g}"
    elif verdicts and all(v.startswith("too few layers") for v in verdicts):
        laws = "no law drawn: too few layers to judge one"
    else:
        laws = f"no law drawn: none fits with adjusted R² ≥ {min_adj_r2:g}"
    text = (
        f"{figure_text(title)} (threshold {threshold:g}; {laws}{band})"
        if title
        else f"threshold {threshold:g}; {laws}{band}"
    )
    fig.suptitle("\n".join(textwrap.wrap(text, width=int(80 * max(len(stacks), 1)))), fontsize=11)
    return fig


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
    """:func:`rank_figure` written to ``path`` (PNG)."""
    fig = rank_figure(table, fits, threshold, of=of, title=title, value=value)
    return write_atomically(Path(path), lambda tmp: fig.savefig(tmp, format="png"))
