"""What both pictures of a map share: the groups of models and their colours, the checks of ``coords`` and
``meta``, and the text of axes and names."""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ...analyse.tree import KINDS

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


def _group_alpha(count: int) -> float:
    """Opacity of a group's points on a dense map: about 10 overlapping points of a group of 1,000 saturate
    its colour, a group of a few dozen stays opaque (so that it is not lost among thousands)."""
    return float(np.clip(0.9 * math.sqrt(150.0 / max(count, 1)), 0.25, 0.9))


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


def _html_text(text: str) -> str:
    """Text shown by plotly, which reads a little HTML (<b>, <br>, ...): escape it to show it as it is."""
    return html.escape(str(text), quote=False)
