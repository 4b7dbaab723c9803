"""The map as an interactive plotly figure for the HTML page: one set of traces per colouring, the hover, the
model tree's edges and the buttons; :func:`plot_html` writes it out as a page (:mod:`.page`)."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ...core.output import write_atomically
from .groups import (
    _TITLES,
    COLOR_BY,
    KIND_COLOURS,
    UNLABELLED_COLOR,
    _axis_name,
    _check,
    _group_alpha,
    _html_text,
    _values,
    grouping,
)
from .page import _html_page
from .tree_hover import _tree_rows, _TreeRows

if TYPE_CHECKING:
    from ...analyse.tree import Tree

#: From this many models the HTML page draws its points with WebGL (plotly ``scattergl``) rather than SVG.
WEBGL_FROM = 1000
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
