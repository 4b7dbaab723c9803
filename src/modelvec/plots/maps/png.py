"""The map as a PNG for papers and notes: a matplotlib figure of the groups' points, their legend and titles, shaded
by density when the models are many."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ...core.output import write_atomically
from ..text import figure_text
from .groups import _PLURALS, _TITLES, UNLABELLED_COLOR, Grouping, _axis_name, _check, _group_alpha, grouping

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: From this many models the PNG shades the map by density (hexagons) under small, translucent points.
DENSE_FROM = 2000
#: Hexagons across the longer side of a dense map, and their shades from one model to the most.
DENSITY_GRID = 60
DENSITY_COLORS = ("#f3f3f3", "#808080")


def map_figure(
    coords: np.ndarray,
    meta: pd.DataFrame,
    *,
    color_by: str = "dataset",
    reducer: str = "umap",
    title: str = "",
    subtitle: str = "",
) -> Figure:
    """The map of :func:`plot_png` as a matplotlib Figure (no pyplot: no global backend or figure state).

    From :data:`DENSE_FROM` models on, thousands of points would overlap into blobs of whichever colour
    is drawn last: the map is then shaded by how many models lie in each hexagon (grey, log scale, with
    its colour bar; the collection's gid is ``modelvec-density``), under smaller, edgeless points whose
    opacity falls with their group's size. Smaller maps are points alone.
    """
    coords = _check(coords, meta)
    g = grouping(meta, color_by)

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8.8, 6.6), dpi=150)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    dense = len(coords) >= DENSE_FROM
    if dense:
        _draw_density(fig, ax, coords)
    _draw_points(ax, coords, g, dense=dense)
    _draw_legend(ax, g)
    _style_axes(ax, _axis_name(reducer))
    summary = _summary(g, len(coords))
    _draw_titles(ax, title, f"{subtitle}  ·  {summary}" if subtitle else summary)
    return fig


def plot_png(
    coords: np.ndarray,
    meta: pd.DataFrame,
    path: str | os.PathLike,
    *,
    color_by: str = "dataset",
    reducer: str = "umap",
    title: str = "",
    subtitle: str = "",
) -> Path:
    """Write a scatter plot of ``coords`` coloured by ``color_by`` as a PNG (150 dpi) at ``path``.

    ``reducer`` names the axes ("umap" -> "UMAP 1"/"UMAP 2", "tsne" -> "t-SNE", "pca" -> "PC";
    any other string is used as it is). Under the title, a line counts the models, how many
    have a value and how many groups there are (after ``subtitle`` when one is given). The
    axes have equal scales: distances on the picture are comparable in every direction. A map of
    :data:`DENSE_FROM` models or more is shaded by density (:func:`map_figure`).
    """
    fig = map_figure(coords, meta, color_by=color_by, reducer=reducer, title=title, subtitle=subtitle)

    def write(tmp: str) -> None:
        fig.savefig(tmp, format="png", dpi=150, bbox_inches="tight", pad_inches=0.15, facecolor="white")

    return write_atomically(Path(path), write)


def _draw_points(ax: Any, coords: np.ndarray, g: Grouping, *, dense: bool) -> None:
    """One scatter per group, the largest first so that small groups are drawn on top and stay visible.

    A dense map gets smaller markers without edges, and each group an opacity that falls with its size
    (:func:`_group_alpha`): where a group's points pile up its colour deepens instead of flattening.
    """
    n = len(coords)
    size = float(np.clip(36.0 * math.sqrt(100.0 / max(n, 1)), 2.0 if dense else 5.0, 36.0))
    labels = np.array([label if label is not None else "" for label in g.labels], dtype=object)
    none = np.array([label is None for label in g.labels], dtype=bool)
    if none.any():
        ax.scatter(
            coords[none, 0],
            coords[none, 1],
            s=size * 0.55,
            c=UNLABELLED_COLOR,
            alpha=0.35 if dense else 0.6,
            linewidths=0,
            zorder=1,
            rasterized=n > 5000,
        )
    for z, (name, color) in enumerate(g.colors.items()):
        mask = labels == name
        ax.scatter(
            coords[mask, 0],
            coords[mask, 1],
            s=size,
            c=color,
            alpha=_group_alpha(int(mask.sum())) if dense else 0.9,
            edgecolors="none" if dense else "white",
            linewidths=0.4 if size > 10 and not dense else 0.0,
            zorder=2 + z,
            rasterized=n > 5000,
        )


def _draw_density(fig: Any, ax: Any, coords: np.ndarray) -> Any:
    """Shade each hexagon by how many models lie in it (log scale, empty hexagons left white).

    The hexagons are regular on the equal-scaled axes; the colour bar below the map, right of the axis
    name, reads the shades as counts. Returns the hexbin's collection (gid ``modelvec-density``).
    """
    from matplotlib.colors import LinearSegmentedColormap
    from matplotlib.ticker import FuncFormatter

    span_x, span_y = (float(s) for s in np.ptp(coords, axis=0))
    width = max(span_x, span_y) / DENSITY_GRID
    if width > 0:  # hexagon rows are sqrt(3) widths apart
        gridsize = (max(1, round(span_x / width)), max(1, round(span_y / (width * math.sqrt(3)))))
    else:
        gridsize = (1, 1)
    cmap = LinearSegmentedColormap.from_list("modelvec-density", DENSITY_COLORS)
    density = ax.hexbin(
        coords[:, 0], coords[:, 1], gridsize=gridsize, bins="log", mincnt=1, cmap=cmap, linewidths=0, zorder=0.8
    )
    density.set_gid("modelvec-density")
    bar = fig.colorbar(density, cax=ax.inset_axes((0.68, -0.15, 0.32, 0.022)), orientation="horizontal")
    bar.set_label("models per hexagon", fontsize=7.5, color="0.35", labelpad=2)
    most = float(np.max(density.get_array()))
    bar.set_ticks([t for t in (1, 10, 100, 1000, 10_000) if t < most / 3] + [most])  # the most, labelled
    bar.ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))  # 1, 10, 100: not 10^0
    bar.ax.tick_params(labelsize=7, colors="0.35", length=2)
    bar.outline.set_visible(False)
    return density


def _draw_legend(ax: Any, g: Grouping) -> None:
    """The groups with their counts beside the map (two columns past 24 entries), unlabelled last."""
    from matplotlib.lines import Line2D

    def handle(color: str, size: float) -> Line2D:
        return Line2D([], [], ls="", marker="o", markersize=size, markerfacecolor=color, markeredgecolor=color)

    handles = [handle(c, 7) for c in g.colors.values()]
    names = [f"{_short(name)} ({g.counts[name]})" for name in g.colors]
    if g.n_none:
        handles.append(handle(UNLABELLED_COLOR, 5))
        names.append(f"{g.none_name} ({g.n_none})")
    legend = ax.legend(
        handles,
        names,
        title=_TITLES[g.by] + (" (first listed)" if g.multi else ""),
        loc="upper left",
        bbox_to_anchor=(1.02, 1.0),
        frameon=False,
        fontsize=8.5,
        title_fontsize=9.5,
        handletextpad=0.3,
        borderaxespad=0.0,
        ncols=1 if len(names) <= 24 else 2,
    )
    legend.set_alignment("left")  # the title over the entries, not centred


def _style_axes(ax: Any, axis: str) -> None:
    """Named, equal-scaled axes with a light grid: distances read the same in every direction."""
    ax.set_xlabel(f"{axis} 1", fontsize=10)
    ax.set_ylabel(f"{axis} 2", fontsize=10)
    ax.set_aspect("equal", adjustable="datalim")
    ax.tick_params(labelsize=8, colors="0.35")
    ax.grid(True, color="0.92", linewidth=0.6, zorder=0)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    for side in ("left", "bottom"):
        ax.spines[side].set_color("0.6")


def _draw_titles(ax: Any, title: str, line2: str) -> None:
    """The title in bold (when given) over a grey line that counts what the map shows."""
    common: dict[str, Any] = dict(
        xycoords="axes fraction", textcoords="offset points", va="bottom", ha="left", annotation_clip=False
    )
    if title:
        ax.annotate(figure_text(title), (0, 1), xytext=(0, 22), fontsize=13, fontweight="bold", **common)
    ax.annotate(line2, (0, 1), xytext=(0, 8), fontsize=9, color="0.35", **common)


def _short(name: str, limit: int = 42) -> str:
    """A group's name as the PNG's legend draws it: escaped (:func:`~modelvec.plots.text.figure_text`), cut."""
    name = figure_text(name)
    return name if len(name) <= limit else name[: limit - 1] + "…"


def _summary(g: Grouping, n: int) -> str:
    with_value = n - g.n_none
    what = {"dataset": "labelled", "author": "with an author", "label_source": "with a label source"}[g.by]
    plural = _PLURALS[g.by] if g.n_groups != 1 else _TITLES[g.by]
    return f"{n} models · {with_value} {what} · {g.n_groups} {plural}"
