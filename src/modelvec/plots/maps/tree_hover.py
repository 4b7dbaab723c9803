"""The model tree on the HTML map: each row's kind, its parents' rows and the tree's lines of its hover."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pandas as pd

from ...analyse.tree import DECLARED_KIND
from .groups import _html_text

if TYPE_CHECKING:
    from ...analyse.tree import Node, Tree

#: The first children a model's hover names (it counts them all).
CHILDREN_NAMED = 3


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
