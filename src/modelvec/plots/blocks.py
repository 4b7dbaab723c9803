"""The per-block kNN heat map: which layers and families separate the datasets best."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd

from ..core.output import write_atomically
from .depth import FAMILY_NAMES, FAMILY_ORDER


def plot_block_scores(blocks: pd.DataFrame, path: str | os.PathLike, *, title: str = "") -> Path:
    """A heat map of the per-block kNN dataset score: layer (rows; one row when layers are pooled) x family."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    families = sorted(blocks["family"].unique(), key=lambda f: (FAMILY_ORDER.index(f) if f in FAMILY_ORDER else 99, f))

    def row(stack: str, layer: object) -> tuple[str, int | None]:  # a pooled layer may come back as None or NaN
        return stack, None if layer is None or layer != layer else int(layer)  # type: ignore[call-overload]

    rows = list(dict.fromkeys(row(s, layer) for s, layer in zip(blocks["stack"], blocks["layer"])))
    grid = np.full((len(rows), len(families)), np.nan)
    for r in blocks.itertuples():
        grid[rows.index(row(r.stack, r.layer)), families.index(r.family)] = r.knn_score
    fig = Figure(figsize=(1.1 * len(families) + 2.5, 0.45 * len(rows) + 2.0), dpi=150, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    image = ax.imshow(grid, cmap="viridis", vmin=0, vmax=1, aspect="auto")
    ax.set_xticks(range(len(families)), [FAMILY_NAMES.get(f, f) for f in families], rotation=30, ha="right", fontsize=8)
    names = [  # the head's block (Representation(head="vocabulary")) has no layer to name
        s if s == "head" else f"{s} (all layers)" if layer is None else f"{s} layer {layer + 1}" for s, layer in rows
    ]
    ax.set_yticks(range(len(rows)), names, fontsize=8)
    for (i, j), v in np.ndenumerate(grid):
        if v == v:
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7, color="white" if v < 0.6 else "black")
    # a short label: a row of pooled layers makes a short figure, and a long vertical label ran off it
    fig.colorbar(image, ax=ax, label="kNN score", fraction=0.05)
    wrap = max(40, int(9 * (1.1 * len(families) + 2.5)))  # characters of the title a line, as wide as the figure
    heading = "kNN dataset score of each block alone" + (f": {title}" if title else "")
    ax.set_title("\n".join(textwrap.wrap(heading, width=wrap)), fontsize=10)
    return write_atomically(Path(path), lambda tmp: fig.savefig(tmp, format="png"))
