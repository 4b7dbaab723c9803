"""Where the weights alone do not place a model (:mod:`modelvec.analyse.tree.lineage`): a model without a trace, and
a traced one whose card names it, placed as the cards say; a parent that would make a model its own ancestor
refused; and each node's card beside what its weights say."""

from __future__ import annotations

from collections.abc import Mapping

from .nodes import DECLARED_KIND, Node


def declared_merges(
    declared: Mapping[str, tuple[str | None, list[str]]], index: Mapping[str, int]
) -> dict[int, list[int]]:
    """The merges whose cards name two or more stored parents: model -> those parents (indices)."""
    out = {}
    for model, (relation, parents) in declared.items():
        found = [index[p] for p in parents if p in index]
        if model in index and relation == "merge" and len(found) >= 2:
            out[index[model]] = found
    return out


def untraced_node(
    model: str, why: str, base: str, root: set[str], declared: Mapping[str, tuple[str | None, list[str]]]
) -> Node:
    """The node of a model without a trace (``why``: the reason and the remedy): no kind, placed under the parents
    its card names, if any, at confidence 0."""
    parents = [base if p.lower() in root else p for p in declared.get(model, (None, []))[1]]
    return Node(
        model=model, kind="untraced", parent=parents[0] if parents else None, parents=parents, confidence=0.0, note=why
    )


def under_untraced(
    nodes: list[Node],
    untraced: Mapping[str, str],
    declared: Mapping[str, tuple[str | None, list[str]]],
    base: str,
    root: set[str],
) -> None:
    """A traced model placed under the base by its weights whose card names a model without a trace is placed under
    that model: the weights cannot see it, the card is what is known."""
    if not untraced:
        return
    for node in nodes:
        if node.kind in ("untraced", "unrelated", "copy", "merge") or node.parent != base:
            continue
        named = [p for p in declared.get(node.model, (None, []))[1] if p in untraced and p.lower() not in root]
        if named:
            node.parent, node.parents = named[0], [named[0]]
            node.confidence = min(node.confidence, 0.5)
            node.note = f"placed under {named[0]} as its card says: {named[0]} has no trace to check it against"


def acyclic(nodes: list[Node], base: str) -> None:
    """Refuse every parent that would make a model its own ancestor (the tree is acyclic by construction, whatever
    the traces say): such a model is placed under the base, said so."""
    parents = {n.model: list(n.parents) for n in nodes}
    for node in nodes:
        kept = [p for p in node.parents if p != base and not _reaches(p, node.model, parents)]
        kept += [p for p in node.parents if p == base]
        if len(kept) == len(node.parents):
            continue
        dropped = [p for p in node.parents if p not in kept]
        node.parents = kept or [base]
        node.parent = node.parents[0]
        if node.weights is not None and len(node.weights) != len(node.parents):
            node.weights = None
        node.confidence = min(node.confidence, 0.5)
        node.note = f"its weights name {', '.join(dropped)} as its parent, which descends from it: placed above it"
        parents[node.model] = node.parents


def _reaches(start: str, target: str, parents: Mapping[str, list[str]]) -> bool:
    """Whether ``target`` is ``start`` or one of its ancestors (walking every parent, each model once)."""
    seen: set[str] = set()
    stack = [start]
    while stack:
        model = stack.pop()
        if model == target:
            return True
        if model not in seen:
            seen.add(model)
            stack += parents.get(model, [])
    return False


def compare(nodes: list[Node], base: str, root: set[str], declared: Mapping[str, tuple[str | None, list[str]]]) -> None:
    """Each node's declared relation and parents beside what the weights say: ``agrees`` False where they differ
    (nothing declared contradicts nothing; a card that names parents and no relation claims only its parents; a
    re-save or copy agrees with ``quantized``, the Hub's word for it; an untraced model has nothing to contradict
    it); ``root``: the base's names, lower-cased."""
    for node in nodes:
        relation, parents = declared.get(node.model, (None, []))
        node.declared_relation = relation
        node.declared_parents = [base if p.lower() in root else p for p in parents]
        if (relation is None and not parents) or node.kind == "untraced":
            node.agrees = True
            continue
        claimed = DECLARED_KIND.get(relation, "fine-tune") if relation else None
        kind = claimed is None or claimed == node.kind or (node.kind == "copy" and relation == "quantized")
        node.agrees = kind and set(node.declared_parents) == set(node.parents)
