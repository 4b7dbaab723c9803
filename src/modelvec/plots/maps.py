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

Both writers create the parent folders, write to a temporary file beside the target and rename
it into place (so a reader never sees half a file), and return the path.
"""

from __future__ import annotations

import html
import math
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

COLOR_BY = ("dataset", "author", "label_source")
METHOD_AXES = {"umap": "UMAP", "tsne": "t-SNE", "pca": "PC"}
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
UNLABELLED_COLOR = "#c8c8c8"
OTHER_COLOR = "#555555"
_NONE_NAMES = {"dataset": "unlabelled", "author": "no author", "label_source": "no label source"}
_PLURALS = {"dataset": "datasets", "author": "authors", "label_source": "label sources"}
_TITLES = {"dataset": "dataset", "author": "author", "label_source": "label source"}


@dataclass(frozen=True)
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


def plot_png(
    coords: np.ndarray,
    meta: pd.DataFrame,
    path: str | os.PathLike,
    *,
    color_by: str = "dataset",
    method: str = "umap",
    title: str = "",
    subtitle: str = "",
) -> Path:
    """Write a scatter plot of ``coords`` coloured by ``color_by`` as a PNG (150 dpi) at ``path``.

    ``method`` names the axes ("umap" -> "UMAP 1"/"UMAP 2", "tsne" -> "t-SNE", "pca" -> "PC";
    any other string is used as it is). Under the title, a line counts the models, how many
    have a value and how many groups there are (after ``subtitle`` when one is given). The
    axes have equal scales: distances on the picture are comparable in every direction.
    """
    coords = _check(coords, meta)
    g = grouping(meta, color_by)
    axis = _axis_name(method)

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    fig = Figure(figsize=(8.8, 6.6), dpi=150)  # no pyplot: no global backend or figure state is touched
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    n = len(coords)
    size = float(np.clip(36.0 * math.sqrt(100.0 / max(n, 1)), 5.0, 36.0))
    labels = np.array([label if label is not None else "" for label in g.labels], dtype=object)
    none = np.array([label is None for label in g.labels], dtype=bool)
    if none.any():
        ax.scatter(
            coords[none, 0],
            coords[none, 1],
            s=size * 0.55,
            c=UNLABELLED_COLOR,
            alpha=0.6,
            linewidths=0,
            zorder=1,
            rasterized=n > 5000,
        )
    # Largest group first, so that small groups are drawn on top and stay visible.
    for z, (name, color) in enumerate(g.colors.items()):
        mask = labels == name
        ax.scatter(
            coords[mask, 0],
            coords[mask, 1],
            s=size,
            c=color,
            alpha=0.9,
            edgecolors="white",
            linewidths=0.4 if size > 10 else 0.0,
            zorder=2 + z,
            rasterized=n > 5000,
        )

    handles = [
        Line2D([], [], ls="", marker="o", markersize=7, markerfacecolor=c, markeredgecolor=c) for c in g.colors.values()
    ]
    names = [f"{_short(name)} ({g.counts[name]})" for name in g.colors]
    if g.n_none:
        handles.append(
            Line2D(
                [],
                [],
                ls="",
                marker="o",
                markersize=5,
                markerfacecolor=UNLABELLED_COLOR,
                markeredgecolor=UNLABELLED_COLOR,
            )
        )
        names.append(f"{g.none_name} ({g.n_none})")
    legend_title = _TITLES[color_by] + (" (first listed)" if g.multi else "")
    legend = ax.legend(
        handles,
        names,
        title=legend_title,
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

    summary = _summary(g, n)
    line2 = f"{subtitle}  ·  {summary}" if subtitle else summary
    if title:
        ax.annotate(
            title,
            (0, 1),
            xycoords="axes fraction",
            xytext=(0, 22),
            textcoords="offset points",
            fontsize=13,
            fontweight="bold",
            va="bottom",
            ha="left",
        )
    ax.annotate(
        line2,
        (0, 1),
        xycoords="axes fraction",
        xytext=(0, 8),
        textcoords="offset points",
        fontsize=9,
        color="0.35",
        va="bottom",
        ha="left",
    )

    def write(tmp: str) -> None:
        fig.savefig(tmp, format="png", dpi=150, bbox_inches="tight", pad_inches=0.15, facecolor="white")

    return write_atomically(Path(path), write)


def plot_html(
    coords: np.ndarray, meta: pd.DataFrame, path: str | os.PathLike, *, title: str = "", method: str = "umap"
) -> Path:
    """Write an interactive, self-contained HTML page of the map at ``path``.

    plotly.js is embedded in the page (about 5 MB): it opens offline and requests nothing from
    the network. Hovering a point shows the model id, all its datasets, label source and author.
    Buttons above the plot colour the points by dataset, author or label source (one set of
    traces per choice, one trace per group: clicking a legend entry hides that group,
    double-clicking shows it alone). Points are SVG markers (plotly ``scatter``), which stays
    responsive up to some thousands of models.
    """
    coords = _check(coords, meta)
    import plotly.graph_objects as go
    import plotly.io as pio

    axis = _axis_name(method)
    values = {by: _values(meta, by) for by in COLOR_BY}
    custom = np.array(
        [
            [
                _html_text(m),
                _html_text(", ".join(d)) or "—",
                _html_text(", ".join(s)) or "—",
                _html_text(", ".join(a)) or "—",
            ]
            for m, d, s, a in zip(
                meta["model"].astype(str), values["dataset"], values["label_source"], values["author"]
            )
        ],
        dtype=object,
    ).reshape(len(coords), 4)
    hover = (
        "<b>%{customdata[0]}</b><br>datasets: %{customdata[1]}<br>label source: %{customdata[2]}"
        "<br>author: %{customdata[3]}<extra></extra>"
    )
    n = len(coords)
    size = float(np.clip(11.0 * math.sqrt(100.0 / max(n, 1)), 4.0, 11.0))

    fig = go.Figure()
    sets: dict[str, list[int]] = {}
    legend_titles: dict[str, str] = {}
    for by in COLOR_BY:
        g = grouping(meta, by)
        legend_titles[by] = _TITLES[by] + (" (first listed)" if g.multi else "")
        labels = np.array([label if label is not None else "" for label in g.labels], dtype=object)
        indices = []
        none = np.array([label is None for label in g.labels], dtype=bool)
        if none.any():  # first: drawn behind the others
            indices.append(len(fig.data))
            fig.add_trace(
                go.Scatter(
                    x=coords[none, 0],
                    y=coords[none, 1],
                    mode="markers",
                    name=f"{g.none_name} ({g.n_none})",
                    marker=dict(color=UNLABELLED_COLOR, size=size * 0.7, opacity=0.55),
                    customdata=custom[none],
                    hovertemplate=hover,
                    legendrank=10_000,
                    visible=by == "dataset",
                )
            )
        for rank, (name, color) in enumerate(g.colors.items()):
            mask = labels == name
            indices.append(len(fig.data))
            fig.add_trace(
                go.Scatter(
                    x=coords[mask, 0],
                    y=coords[mask, 1],
                    mode="markers",
                    name=f"{_html_text(name)} ({g.counts[name]})",
                    marker=dict(color=color, size=size, opacity=0.9, line=dict(color="white", width=0.5)),
                    customdata=custom[mask],
                    hovertemplate=hover,
                    legendrank=rank + 1,
                    visible=by == "dataset",
                )
            )
        sets[by] = indices
    buttons = []
    for by in COLOR_BY:
        visible = [False] * len(fig.data)
        for i in sets[by]:
            visible[i] = True
        buttons.append(
            dict(
                label=f"colour by {_TITLES[by]}",
                method="update",
                args=[{"visible": visible}, {"legend.title.text": legend_titles[by]}],
            )
        )

    heading = _html_text(title) if title else f"{axis} map"
    fig.update_layout(
        title=dict(
            text=f"{heading}<br><sup>{n} models · hover a point for its model; click a legend entry to hide "
            "it, double-click to show it alone</sup>",
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
        updatemenus=[
            dict(
                type="buttons",
                direction="right",
                buttons=buttons,
                active=0,
                showactive=True,
                x=0.0,
                xanchor="left",
                y=1.01,
                yanchor="bottom",
                pad=dict(r=4, b=4),
                font=dict(size=11),
            )
        ],
    )
    page = pio.to_html(
        fig,
        include_plotlyjs=True,
        full_html=True,
        include_mathjax=False,
        div_id="modelvec-map",
        config={
            "displaylogo": False,
            "responsive": True,
            "toImageButtonOptions": {"format": "png", "filename": "modelvec-map"},
        },
    )
    page_title = html.escape(title or f"modelvec {axis} map")
    page = page.replace("<head>", f"<head>\n    <title>{page_title}</title>", 1)
    return write_atomically(Path(path), lambda tmp: Path(tmp).write_text(page, encoding="utf-8"))


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


def _axis_name(method: str) -> str:
    return METHOD_AXES.get(str(method).lower(), str(method))


def _short(name: str, limit: int = 42) -> str:
    return name if len(name) <= limit else name[: limit - 1] + "…"


def _html_text(text: str) -> str:
    """Text shown by plotly, which reads a little HTML (<b>, <br>, ...): escape it to show it as it is."""
    return html.escape(str(text), quote=False)


def _summary(g: Grouping, n: int) -> str:
    with_value = n - g.n_none
    what = {"dataset": "labelled", "author": "with an author", "label_source": "with a label source"}[g.by]
    plural = _PLURALS[g.by] if g.n_groups != 1 else _TITLES[g.by]
    return f"{n} models · {with_value} {what} · {g.n_groups} {plural}"


def write_atomically(path: Path, write: Callable[[str], Any]) -> Path:
    """Write through a temporary file beside ``path`` and rename it into place: a reader never sees half a file.

    An ``OSError`` (a read-only folder, a full disk) names ``path``: not the temporary file, and a write that
    fails on a full disk names none."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        write(tmp)
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600
        os.replace(tmp, path)
    except BaseException as exc:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc
        raise
    return path
