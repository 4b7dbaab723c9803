"""Pictures of a map: a PNG for papers and notes, a self-contained HTML page to explore.

Both take ``coords`` (n, 2), e.g. from :func:`modelvec.analyse.reduction.reduce`, and ``meta``, a
:class:`pandas.DataFrame` with one row per model, in the same order, and the columns

- ``model`` (str): the model id,
- ``datasets`` (list of str; empty, None or NaN = unlabelled; a single string counts as one),
- ``label_source`` (str or None; e.g. ``"card"``) and ``author`` (str or None); either may be
  missing, which is the same as None everywhere.

Colours (the same in both pictures, see :func:`grouping`):

- One colour per group (dataset, author or label source), the largest group first. A model
  with several datasets is coloured by its first one (the order its card lists them); the
  hover text of the HTML page shows all of them, and the PNG's legend title says
  "first listed" when it happens.
- The palette is tab10 followed by the light half of tab20, both without their greys: 18
  distinct colours. Grey is kept for models without a value ("unlabelled": faint light grey,
  small, drawn behind the rest) and, when there are more than 18 groups, for the smallest
  groups lumped together as "k other datasets" (dark grey).

Many models (thousands of fine-tunes of one base) stay readable: from :data:`DENSE_FROM` models the PNG
shades the map by how many models lie in each hexagon, under small translucent points (so piles of points
read as density, not as one blob); from :data:`WEBGL_FROM` the HTML page draws with WebGL. The page has a
search box that finds a model by part of its id, whatever the map's size. Given the model tree, the page also
colours by kind, shows each model's place in the tree on hover, and draws the edges of the model clicked or found
(every edge at once only up to :data:`ALL_EDGES_UP_TO` models: beyond, they are a tangle).

Both writers create the parent folders, write to a temporary file beside the target and rename
it into place (so a reader never sees half a file), and return the path.
"""

from __future__ import annotations

import html
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ..analyse.tree import DECLARED_KIND, KINDS
from ..core.output import write_atomically
from .text import figure_text

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from ..analyse.tree import Node, Tree

COLOR_BY = ("dataset", "author", "label_source")
REDUCER_AXES = {"umap": "UMAP", "tsne": "t-SNE", "pca": "PC"}
# tab10 then the light half of tab20, without the greys (grey means "no value" / "other" here).
PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#bcbd22",
    "#17becf",
    "#aec7e8",
    "#ffbb78",
    "#98df8a",
    "#ff9896",
    "#c5b0d5",
    "#c49c94",
    "#f7b6d2",
    "#dbdb8d",
    "#9edae5",
)
#: One colour per kind of the inferred tree, the same in every figure (the tree's and the maps').
KIND_COLOURS = dict(zip(KINDS, PALETTE))
UNLABELLED_COLOR = "#c8c8c8"
OTHER_COLOR = "#555555"
_NONE_NAMES = {"dataset": "unlabelled", "author": "no author", "label_source": "no label source"}
_PLURALS = {"dataset": "datasets", "author": "authors", "label_source": "label sources"}
_TITLES = {"dataset": "dataset", "author": "author", "label_source": "label source", "kind": "kind"}
#: From this many models the PNG shades the map by density (hexagons) under small, translucent points.
DENSE_FROM = 2000
#: From this many models the HTML page draws its points with WebGL (plotly ``scattergl``) rather than SVG.
WEBGL_FROM = 1000
#: Hexagons across the longer side of a dense map, and their shades from one model to the most.
DENSITY_GRID = 60
DENSITY_COLORS = ("#f3f3f3", "#808080")
# The HTML page's hover label: plotly's template over the escaped values of _hover_rows (column 4 is the model's row,
# for the page's script; columns 5 to 8, where the tree is known, its kind, parents, children and card, from
# _tree_hover: the markup is the template's, once a trace, the values plain escaped text).
HOVER = (
    "<b>%{customdata[0]}</b><br>datasets: %{customdata[1]}<br>label source: %{customdata[2]}"
    "<br>author: %{customdata[3]}<extra></extra>"
)
HOVER_TREE = HOVER.replace(
    "<extra>", "<br>kind: %{customdata[5]}<br>%{customdata[6]}<br>children: %{customdata[7]}<br>%{customdata[8]}<extra>"
)
#: Models up to which the HTML page also has a toggle that draws every edge of the model tree at once (beyond, lines
#: between thousands of points are a tangle: the page draws the edges of the model clicked or found).
ALL_EDGES_UP_TO = 300
#: The first children a model's hover names (it counts them all).
CHILDREN_NAMED = 3


@dataclass(frozen=True, kw_only=True)
class Grouping:
    """Which group each model is drawn in, and the groups' colours, for one ``color_by``.

    ``labels[i]`` is model i's group name, or None when it has no value (drawn as
    ``none_name``). ``colors`` maps the groups to colours in legend order: largest first
    (ties by name), the lumped "k other ..." group last. ``counts`` has the same keys.
    ``n_groups`` counts the distinct groups before lumping. ``multi`` counts the models that had
    several values (only datasets can).
    """

    by: str
    labels: tuple[str | None, ...]
    colors: dict[str, str]
    counts: dict[str, int]
    none_name: str
    n_none: int
    n_groups: int
    multi: int


def grouping(meta: pd.DataFrame, by: str = "dataset", *, max_colors: int = len(PALETTE)) -> Grouping:
    """Group the models of ``meta`` by their first dataset, their author or their label source.

    With more than ``max_colors`` groups the largest ``max_colors - 1`` keep their colours and
    the rest become one "k other <plural>" group in dark grey.
    """
    if by not in COLOR_BY:
        raise ValueError(f"unknown color_by {by!r}: expected one of {', '.join(COLOR_BY)}")
    if not 1 <= max_colors <= len(PALETTE):
        raise ValueError(f"max_colors must be between 1 and {len(PALETTE)}, got {max_colors}")
    _check_meta(meta)
    values = _values(meta, by)
    first = [v[0] if v else None for v in values]
    counts: dict[str, int] = {}
    for label in first:
        if label is not None:
            counts[label] = counts.get(label, 0) + 1
    order = sorted(counts, key=lambda g: (-counts[g], g))
    if len(order) > max_colors:
        kept, lumped = order[: max_colors - 1], order[max_colors - 1 :]
        other = f"{len(lumped)} other {_PLURALS[by]}"
        lumped_set = set(lumped)
        first = [other if label in lumped_set else label for label in first]
        colors = {g: PALETTE[i] for i, g in enumerate(kept)} | {other: OTHER_COLOR}
        counts = {g: counts[g] for g in kept} | {other: sum(counts[g] for g in lumped)}
    else:
        colors = {g: PALETTE[i] for i, g in enumerate(order)}
        counts = {g: counts[g] for g in order}
    return Grouping(
        by=by,
        labels=tuple(first),
        colors=colors,
        counts=counts,
        none_name=_NONE_NAMES[by],
        n_none=sum(label is None for label in first),
        n_groups=len(order),
        multi=sum(len(v) > 1 for v in values),
    )


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


def _group_alpha(count: int) -> float:
    """Opacity of a group's points on a dense map: about 10 overlapping points of a group of 1,000 saturate
    its colour, a group of a few dozen stays opaque (so that it is not lost among thousands)."""
    return float(np.clip(0.9 * math.sqrt(150.0 / max(count, 1)), 0.25, 0.9))


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


def plot_html(
    coords: np.ndarray,
    meta: pd.DataFrame,
    path: str | os.PathLike,
    *,
    title: str = "",
    reducer: str = "umap",
    tree: Tree | None = None,
) -> Path:
    """Write an interactive, self-contained HTML page of the map at ``path``.

    plotly.js is embedded in the page (about 5 MB): it opens offline and requests nothing from
    the network. Hovering a point shows the model id, all its datasets, label source and author.
    Buttons above the plot colour the points by dataset, author or label source (one set of
    traces per choice, one trace per group: clicking a legend entry hides that group,
    double-clicking shows it alone). A search box above the map finds the models whose id contains
    what is typed (any case): it rings them, points an arrow at one (Enter: the next) and says how
    many matched. Up to :data:`WEBGL_FROM` models the points are SVG markers (plotly ``scatter``);
    from there on WebGL (``scattergl``), which stays responsive with tens of thousands.

    ``tree`` (the model tree of the mapped models, :func:`modelvec.report.tree.tree_of`), where it is known, adds a
    colouring by kind (the tree figure's colours, :data:`KIND_COLOURS`), the tree in each
    hover (kind, parents, children, what the card declares and whether the weights agree), and the edges of one
    model at a time, at any size: clicking a model, or finding it, draws the lines to its parents (dark) and its
    children (light) and replaces those drawn before; thousands of edges at once would be a tangle. Up to
    :data:`ALL_EDGES_UP_TO` models a toggle also draws every edge at once.
    """
    coords = _check(coords, meta)
    import plotly.graph_objects as go

    axis = _axis_name(reducer)
    webgl = len(coords) >= WEBGL_FROM
    rows = _tree_rows(tree, meta) if tree is not None else None
    hover = HOVER if rows is None else HOVER_TREE
    fig = go.Figure()
    sets, legend_titles = _add_map_traces(fig, coords, meta, webgl=webgl, rows=rows)
    mark = len(fig.data)  # the search's rings: empty until something is searched
    trace = go.Scattergl if webgl else go.Scatter
    fig.add_trace(
        trace(
            x=[],
            y=[],
            mode="markers",
            name="search",
            showlegend=False,
            marker=dict(symbol="circle-open", size=16, color="#111111", line=dict(width=2.5)),
            hovertemplate=hover,
        )
    )
    edges = _add_edges(fig, coords, rows, webgl=webgl) if rows is not None else []
    heading = _html_text(title) if title else f"{axis} map"
    _layout_html(fig, sets, legend_titles, mark=mark, n=len(coords), heading=heading, axis=axis, edges=edges)
    script = {"parents": rows.parents, "traces": edges[:2]} if rows is not None else None
    page = _html_page(fig, sources=sets["dataset"], mark=mark, tree=script, page_title=title or f"modelvec {axis} map")
    return write_atomically(Path(path), lambda tmp: Path(tmp).write_text(page, encoding="utf-8"))


@dataclass(frozen=True)
class _TreeRows:
    """The model tree as the map's rows: per row of ``meta``, its kind (None: not in the tree), the rows of its
    parents on the map (the base is not on it), and its values of the hover, escaped (:func:`_tree_hover`)."""

    kinds: list[str | None]
    parents: list[list[int]]
    hover: list[tuple[str, str, str, str]]


def _tree_rows(tree: Tree, meta: pd.DataFrame) -> _TreeRows:
    """The tree's nodes as rows of ``meta``: one pass over the nodes, so 10,000 models take milliseconds."""
    by_model = tree.by_model()
    row = {m: i for i, m in enumerate(meta["model"].astype(str))}
    children: dict[str, list[str]] = {}
    for each in tree.nodes:
        for parent in dict.fromkeys(each.parents):
            children.setdefault(parent, []).append(each.model)
    kinds: list[str | None] = []
    parents: list[list[int]] = []
    hover: list[tuple[str, str, str, str]] = []
    for model in meta["model"].astype(str):
        node = by_model.get(model)
        if node is None:
            kinds.append(None)
            parents.append([])
            hover.append(("not in the model tree", "parent: —", "—", "card: —"))
            continue
        kinds.append(node.kind)
        parents.append([row[p] for p in dict.fromkeys(node.parents) if p in row])
        hover.append(_tree_hover(node, children.get(model, []), tree.base))
    return _TreeRows(kinds=kinds, parents=parents, hover=hover)


def _tree_hover(node: Node, children: list[str], base: str) -> tuple[str, str, str, str]:
    """A model's values of the hover: its kind, parents (a merge's with their weights), children (how many, the first
    :data:`CHILDREN_NAMED` by name) and its card's claim beside the weights'. Plain text, names escaped: the line
    breaks and labels are :data:`HOVER_TREE`'s, once a trace rather than once a model (a page of 10,000 models)."""

    def name(model: str) -> str:
        return "the base" if model == base else _html_text(model)

    kind = node.kind if node.kind == "untraced" else f"{node.kind} (confidence {node.confidence:.2f})"
    if node.copy_of is not None:
        kind += f", a copy of {name(node.copy_of)}"
    weights = node.weights if node.weights is not None and len(node.weights) == len(node.parents) else None
    named = (
        [f"{name(p)} ({w:.2f})" for p, w in zip(node.parents, weights)] if weights else [name(p) for p in node.parents]
    )
    if not named:
        up = "parent: none" + (" (unrelated weights)" if node.kind == "unrelated" else "")
    else:
        up = ("parent: " if len(named) == 1 else "parents: ") + ", ".join(named)
    first = sorted(children)[:CHILDREN_NAMED]
    down = "none"
    if children:
        more = ", …" if len(children) > len(first) else ""
        down = f"{len(children)} ({', '.join(_html_text(c) for c in first)}{more})"
    declared = ", ".join(name(p) for p in node.declared_parents)
    if node.declared_relation is None and not declared:
        card = "card: declares no parent"
    else:
        if node.declared_relation is None:
            card = f"card: derived from {declared}"
        else:
            claim = _html_text(DECLARED_KIND.get(node.declared_relation, node.declared_relation))
            card = f"card: {claim} of {declared}" if declared else f"card: {claim}, no parent named"
        card += " — ⚠ the weights disagree" if not node.agrees else " — the weights agree"
    return kind, up, down, card


def _hover_rows(meta: pd.DataFrame, tree_hover: list[tuple[str, str, str, str]] | None = None) -> np.ndarray:
    """Per model: its id, datasets, label source and author, escaped for plotly (which reads a little HTML), its
    row (the page's script finds a model's tree by it) and, given, its values of the tree."""
    values = {by: _values(meta, by) for by in COLOR_BY}
    rows = [
        [
            _html_text(m),
            _html_text(", ".join(d)) or "—",
            _html_text(", ".join(s)) or "—",
            _html_text(", ".join(a)) or "—",
            i,
        ]
        for i, (m, d, s, a) in enumerate(
            zip(meta["model"].astype(str), values["dataset"], values["label_source"], values["author"])
        )
    ]
    if tree_hover is not None:
        for row, lines in zip(rows, tree_hover):
            row.extend(lines)
    return np.array(rows, dtype=object).reshape(len(meta), 5 if tree_hover is None else 9)


@dataclass(frozen=True)
class _Group:
    """One trace of a colouring: its models, legend entry, marker and legend rank."""

    mask: np.ndarray
    name: str
    marker: dict[str, Any]
    rank: int


def _groups(meta: pd.DataFrame, by: str, *, size: float, webgl: bool) -> tuple[str, list[_Group]]:
    """One colouring by dataset, author or label source (:func:`grouping`): its legend title and its groups, the
    models without a value first (drawn behind the others), then the largest group first."""
    g = grouping(meta, by)
    labels = np.array([label if label is not None else "" for label in g.labels], dtype=object)
    groups: list[_Group] = []
    none = np.array([label is None for label in g.labels], dtype=bool)
    if none.any():
        marker = dict(color=UNLABELLED_COLOR, size=size * 0.7, opacity=0.55)
        groups.append(_Group(none, f"{g.none_name} ({g.n_none})", marker, 10_000))
    for rank, (name, color) in enumerate(g.colors.items()):
        mask = labels == name
        marker = _marker(color, size, int(mask.sum()), webgl=webgl)
        groups.append(_Group(mask, f"{_html_text(name)} ({g.counts[name]})", marker, rank + 1))
    return _TITLES[by] + (" (first listed)" if g.multi else ""), groups


def _kind_groups(kinds: list[str | None], *, size: float, webgl: bool) -> tuple[str, list[_Group]]:
    """The colouring by the tree's kind, in the tree figure's colours: the largest kind drawn first (under the
    rarer ones), the legend in the order of :data:`~modelvec.analyse.tree.KINDS`, models not in the tree grey."""
    labels = np.array([k if k is not None else "" for k in kinds], dtype=object)
    groups: list[_Group] = []
    none = labels == ""
    if none.any():
        marker = dict(color=UNLABELLED_COLOR, size=size * 0.7, opacity=0.55)
        groups.append(_Group(none, f"not in the tree ({int(none.sum())})", marker, 10_000))
    counts = {k: int((labels == k).sum()) for k in KIND_COLOURS}
    for kind in sorted((k for k in KIND_COLOURS if counts[k]), key=lambda k: -counts[k]):
        marker = _marker(KIND_COLOURS[kind], size, counts[kind], webgl=webgl)
        groups.append(_Group(labels == kind, f"{kind} ({counts[kind]})", marker, list(KIND_COLOURS).index(kind) + 1))
    return "kind (from the weights)", groups


def _marker(color: str, size: float, count: int, *, webgl: bool) -> dict[str, Any]:
    """A group's marker: with WebGL (many models) no edge and translucent by size (:func:`_group_alpha`), so that
    piles of points show as such."""
    opacity = _group_alpha(count) if webgl else 0.9
    return dict(color=color, size=size, opacity=opacity, line=dict(color="white", width=0 if webgl else 0.5))


def _add_map_traces(
    fig: Any, coords: np.ndarray, meta: pd.DataFrame, *, webgl: bool, rows: _TreeRows | None = None
) -> tuple[dict[str, list[int]], dict[str, str]]:
    """One set of traces per colouring (only the dataset's visible; by kind where the tree is known), one trace per
    group. Returns each colouring's trace indices and its legend title."""
    import plotly.graph_objects as go

    trace = go.Scattergl if webgl else go.Scatter
    custom = _hover_rows(meta, rows.hover if rows is not None else None)
    size = float(np.clip(11.0 * math.sqrt(100.0 / max(len(coords), 1)), 4.0, 11.0))
    colourings = {by: _groups(meta, by, size=size, webgl=webgl) for by in COLOR_BY}
    if rows is not None:
        colourings["kind"] = _kind_groups(rows.kinds, size=size, webgl=webgl)
    sets: dict[str, list[int]] = {}
    legend_titles: dict[str, str] = {}
    for by, (legend_title, groups) in colourings.items():
        legend_titles[by] = legend_title
        sets[by] = list(range(len(fig.data), len(fig.data) + len(groups)))
        for g in groups:
            fig.add_trace(
                trace(
                    x=coords[g.mask, 0],
                    y=coords[g.mask, 1],
                    mode="markers",
                    name=g.name,
                    marker=g.marker,
                    customdata=custom[g.mask],
                    hovertemplate=HOVER if rows is None else HOVER_TREE,
                    legendrank=g.rank,
                    visible=by == "dataset",
                )
            )
    return sets, legend_titles


def _add_edges(fig: Any, coords: np.ndarray, rows: _TreeRows, *, webgl: bool) -> list[int]:
    """The traces of the model tree's edges: the clicked or found model's lines to its parents and to its children
    (empty until the page's script fills them) and, up to :data:`ALL_EDGES_UP_TO` models, every edge between mapped
    models in one trace, hidden until toggled. Returns their indices (the toggled one last)."""
    import plotly.graph_objects as go

    trace = go.Scattergl if webgl else go.Scatter
    common: dict[str, Any] = dict(x=[], y=[], mode="lines", showlegend=False, hoverinfo="skip")
    fig.add_trace(trace(name="parent edges", line=dict(color="#111111", width=2.5), **common))
    fig.add_trace(trace(name="child edges", line=dict(color="rgba(60,60,60,0.6)", width=1.2), **common))
    if len(coords) > ALL_EDGES_UP_TO:
        return [len(fig.data) - 2, len(fig.data) - 1]
    xs: list[float | None] = []
    ys: list[float | None] = []
    for child, parents in enumerate(rows.parents):
        for parent in parents:
            xs += [float(coords[child, 0]), float(coords[parent, 0]), None]
            ys += [float(coords[child, 1]), float(coords[parent, 1]), None]
    fig.add_trace(
        trace(
            x=xs,
            y=ys,
            mode="lines",
            name="model tree",
            visible=False,
            showlegend=False,
            hoverinfo="skip",
            line=dict(color="rgba(60,60,60,0.55)", width=1),
        )
    )
    return [len(fig.data) - 3, len(fig.data) - 2, len(fig.data) - 1]


def _layout_html(
    fig: Any,
    sets: dict[str, list[int]],
    legend_titles: dict[str, str],
    *,
    mark: int,
    n: int,
    heading: str,
    axis: str,
    edges: Sequence[int] = (),
) -> None:
    """Title, equal-scaled axes, the legend, and the buttons that switch colourings (the search's rings
    stay visible under each), and where the model tree is drawn, the toggle of all its edges (the colourings leave
    the edges as they are)."""
    buttons = []
    points = [i for i in range(len(fig.data)) if i not in edges]
    for by in sets:
        shown = {*sets[by], mark}
        buttons.append(
            dict(
                label=f"colour by {_TITLES[by]}",
                method="update",
                args=[{"visible": [i in shown for i in points]}, {"legend.title.text": legend_titles[by]}, points],
            )
        )
    menus = [_button_row(buttons, left=True)]
    if len(edges) > 2:
        toggle = [
            dict(label="tree edges off", method="restyle", args=[{"visible": False}, [edges[2]]]),
            dict(label="tree edges on", method="restyle", args=[{"visible": True}, [edges[2]]]),
        ]
        menus.append(_button_row(toggle, left=False))
    how = "click a model, or find it by name above, for its edges in the model tree; " if edges else ""
    fig.update_layout(
        title=dict(
            text=f"{heading}<br><sup>{n} models · hover a point for its model, or find one by name above; {how}click "
            "a legend entry to hide it, double-click to show it alone</sup>",
            x=0.01,
            xanchor="left",
            y=0.98,
            yanchor="top",
        ),
        template="plotly_white",
        hovermode="closest",
        height=760,
        margin=dict(t=105, l=60, r=20, b=60),
        legend=dict(title=dict(text=legend_titles["dataset"]), itemsizing="constant"),
        xaxis=dict(title=dict(text=f"{axis} 1"), zeroline=False),
        yaxis=dict(title=dict(text=f"{axis} 2"), zeroline=False, scaleanchor="x", scaleratio=1),
        updatemenus=menus,
    )


def _button_row(buttons: list[dict], *, left: bool) -> dict[str, Any]:
    """A row of buttons above the map, at its left or right edge, the first one active."""
    return dict(
        type="buttons",
        direction="right",
        buttons=buttons,
        active=0,
        showactive=True,
        x=0.0 if left else 1.0,
        xanchor="left" if left else "right",
        y=1.01,
        yanchor="bottom",
        pad=dict(r=4, b=4),
        font=dict(size=11),
    )


def _html_page(fig: Any, *, sources: list[int], mark: int, page_title: str, tree: dict[str, Any] | None = None) -> str:
    """The whole page: plotly.js inline, the search box over the map and its script run once the map is drawn.

    Nothing from the models reaches the page as markup: names travel as JSON data (plotly escapes ``<``,
    ``>`` and ``/``), the script writes them as text, and the annotation shows plotly's escaped copy. ``tree``
    (rows and trace indices only, no names): each row's parents' rows and the traces of one model's edges.
    """
    import json

    import plotly.io as pio

    script = (
        SEARCH_JS.replace("__SOURCES__", json.dumps([int(i) for i in sources]))
        .replace("__MARK__", str(mark))
        .replace("__TREE__", json.dumps(tree, separators=(",", ":")))
    )
    page = pio.to_html(
        fig,
        include_plotlyjs=True,
        full_html=True,
        include_mathjax=False,
        div_id="modelvec-map",
        post_script=script,
        config={
            "displaylogo": False,
            "responsive": True,
            "toImageButtonOptions": {"format": "png", "filename": "modelvec-map"},
        },
    )
    page = page.replace("<head>", f"<head>\n    <title>{html.escape(page_title)}</title>", 1)
    return page.replace("<body>", f"<body>\n{SEARCH_HTML}", 1)


# The search box: disabled until its script (below) has indexed the map's models. Under it, where the tree is known,
# a line that names the model whose edges are drawn.
SEARCH_HTML = """\
<div id="modelvec-search" style="font: 13px system-ui, sans-serif; padding: 8px 12px 0; color: #333;">
  <label for="modelvec-search-input">find a model</label>
  <input id="modelvec-search-input" type="search" size="40" placeholder="part of its id, e.g. org/name"
         autocomplete="off" spellcheck="false" disabled>
  <span id="modelvec-search-status" role="status" aria-live="polite" style="margin-left: 8px;"></span>
  <div id="modelvec-tree-status" role="status" aria-live="polite" style="margin-top: 4px; min-height: 1em;"></div>
</div>"""
# Run by plotly once the map is drawn ({plot_id}: the map's div). Reads plotly's _fullData (where x and y are
# decoded arrays; the page carries them base64-encoded). Indexes the models of one colouring's traces
# (__SOURCES__; every colouring holds every model), matches a case-insensitive substring of the id, rings the
# matches in the trace __MARK__ and points an arrow at one of them (an exact id first, then in order of id; Enter:
# the next). __TREE__ (null without a tree): each row's parents' rows, and the two traces that draw the edges of the
# model clicked or found, to its parents and to its children (found from the parents once, when the page opens).
# Names are only ever written as text.
SEARCH_JS = """
(function () {
  var gd = document.getElementById('{plot_id}');
  var box = document.getElementById('modelvec-search-input');
  var status = document.getElementById('modelvec-search-status');
  var treeStatus = document.getElementById('modelvec-tree-status');
  var SOURCES = __SOURCES__, MARK = __MARK__, TREE = __TREE__;
  var plain = function (s) {
    return String(s).replace(/&lt;/g, '<').replace(/&gt;/g, '>').replace(/&amp;/g, '&');
  };
  var models = [], byRow = [], children = [];
  SOURCES.forEach(function (t) {
    var full = gd._fullData.filter(function (d) { return d.index === t; })[0];
    for (var k = 0; k < full.x.length; k++) {
      var row = full.customdata[k], name = plain(row[0]);
      var model = {name: name, lower: name.toLowerCase(), x: full.x[k], y: full.y[k], row: row};
      models.push(model);
      byRow[row[4]] = model;
    }
  });
  if (TREE) TREE.parents.forEach(function (up, r) {
    up.forEach(function (p) { (children[p] = children[p] || []).push(r); });
  });
  function lines(m, rows) {
    var x = [], y = [];
    rows.forEach(function (r) { var o = byRow[r]; if (o) { x.push(m.x, o.x, null); y.push(m.y, o.y, null); } });
    return [x, y];
  }
  function showTree(m) {  // m: a model of the index, or null to clear
    if (!TREE) return;
    var up = m ? TREE.parents[m.row[4]] : [], down = m ? children[m.row[4]] || [] : [];
    var a = m ? lines(m, up) : [[], []], b = m ? lines(m, down) : [[], []];
    Plotly.restyle(gd, {x: [a[0], b[0]], y: [a[1], b[1]]}, TREE.traces);
    treeStatus.textContent = m ? 'edges of ' + m.name + ': ' + up.length + (up.length === 1 ? ' parent' : ' parents')
      + ' (dark) and ' + down.length + (down.length === 1 ? ' child' : ' children') + ' (light) on the map' : '';
    treeStatus.setAttribute('data-row', m ? String(m.row[4]) : '');
  }
  if (TREE) gd.on('plotly_click', function (event) {
    var p = event && event.points && event.points[0];
    var row = p && (p.customdata || (p.data && p.data.customdata ? p.data.customdata[p.pointNumber] : null));
    if (row && byRow[row[4]]) showTree(byRow[row[4]]);
  });
  var found = [], current = 0;
  function say(query) {
    if (!query) { status.textContent = ''; return; }
    if (!found.length) { status.textContent = 'no model matches \\u201c' + query + '\\u201d'; return; }
    var one = found[current].name;
    status.textContent = found.length === 1 ? '1 model matches: ' + one
      : found.length + ' models match; ' + (current + 1) + ' of ' + found.length + ': ' + one + ' (Enter: next)';
  }
  function draw() {
    var hit = found[current];
    Plotly.restyle(gd, {
      x: [found.map(function (m) { return m.x; })],
      y: [found.map(function (m) { return m.y; })],
      customdata: [found.map(function (m) { return m.row; })]
    }, [MARK]);
    Plotly.relayout(gd, {annotations: hit ? [{
      x: hit.x, y: hit.y, text: '<b>' + hit.row[0] + '</b>', showarrow: true, arrowhead: 2, ax: 40, ay: -40,
      bgcolor: 'rgba(255,255,255,0.9)', bordercolor: '#111111', font: {size: 12}
    }] : []});
    showTree(hit || null);
  }
  function search() {
    var query = box.value.trim(), lower = query.toLowerCase();
    found = lower ? models.filter(function (m) { return m.lower.indexOf(lower) >= 0; }) : [];
    found.sort(function (a, b) {  // the model of that very id first, then by id
      return (a.lower !== lower) - (b.lower !== lower) || (a.name < b.name ? -1 : a.name > b.name ? 1 : 0);
    });
    current = 0;
    say(query);
    draw();
  }
  box.addEventListener('input', search);
  box.addEventListener('keydown', function (event) {
    if (event.key !== 'Enter' || found.length < 2) return;
    current = (current + 1) % found.length;
    say(box.value.trim());
    draw();
  });
  box.disabled = false;
  document.getElementById('modelvec-search').setAttribute('data-ready', String(models.length));
})();
"""


# --- helpers -------------------------------------------------------------------------------


def _check_meta(meta: pd.DataFrame) -> None:
    if not isinstance(meta, pd.DataFrame):
        raise ValueError(f"meta must be a pandas DataFrame, got {type(meta).__name__}")
    missing = [c for c in ("model", "datasets") if c not in meta.columns]
    if missing:
        raise ValueError(f"meta lacks the column(s) {', '.join(missing)}")


def _check(coords: np.ndarray, meta: pd.DataFrame) -> np.ndarray:
    coords = np.asarray(coords, dtype=np.float64)
    if coords.ndim != 2 or coords.shape[1] != 2 or coords.shape[0] < 1:
        raise ValueError(f"coords must have shape (n, 2) with n >= 1, got {coords.shape}")
    if not np.isfinite(coords).all():
        raise ValueError("coords contain NaN or infinite values")
    _check_meta(meta)
    if len(meta) != len(coords):
        raise ValueError(f"meta has {len(meta)} rows but coords {len(coords)}: one row per model, same order")
    return coords


def _is_missing(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, float) and math.isnan(value):
        return True
    return value is pd.NA or value is pd.NaT


def _values(meta: pd.DataFrame, by: str) -> list[list[str]]:
    """Per model, its datasets / [author] / [label source] as non-empty strings."""
    column = {"dataset": "datasets"}.get(by, by)
    if column not in meta.columns:
        return [[] for _ in range(len(meta))]
    out = []
    for value in meta[column].tolist():
        if _is_missing(value):
            items: list[Any] = []
        elif isinstance(value, str):
            items = [value]
        else:
            items = list(value)  # list, tuple, numpy array (as pyarrow / duckdb give them)
        out.append([str(v).strip() for v in items if not _is_missing(v) and str(v).strip()])
    return out


def _axis_name(reducer: str) -> str:
    return REDUCER_AXES.get(str(reducer).lower(), str(reducer))


def _short(name: str, limit: int = 42) -> str:
    """A group's name as the PNG's legend draws it: escaped (:func:`~modelvec.plots.text.figure_text`), cut."""
    name = figure_text(name)
    return name if len(name) <= limit else name[: limit - 1] + "…"


def _html_text(text: str) -> str:
    """Text shown by plotly, which reads a little HTML (<b>, <br>, ...): escape it to show it as it is."""
    return html.escape(str(text), quote=False)


def _summary(g: Grouping, n: int) -> str:
    with_value = n - g.n_none
    what = {"dataset": "labelled", "author": "with an author", "label_source": "with a label source"}[g.by]
    plural = _PLURALS[g.by] if g.n_groups != 1 else _TITLES[g.by]
    return f"{n} models · {with_value} {what} · {g.n_groups} {plural}"
