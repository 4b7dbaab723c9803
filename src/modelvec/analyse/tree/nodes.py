"""The model tree inferred from the weights, as data: each stored model's node (its parent, kind, confidence, and
what its card declares) and the tree of one base's nodes, with their JSON (a tree kept beside the store is read
back from it). How a tree is inferred from the traces: :mod:`modelvec.analyse.tree.lineage`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

KINDS = ("fine-tune", "adapter", "merge", "quantization", "unrelated", "copy", "untraced")
#: A declared relation (the Hub's ``base_model_relation``) as the kind it claims.
DECLARED_KIND = {"finetune": "fine-tune", "adapter": "adapter", "merge": "merge", "quantized": "quantization"}


@dataclass(kw_only=True)
class Node:
    """One model of the inferred tree; ``parent`` None for unrelated weights, ``base`` for the base (the caller's
    name for it), ``parents`` every parent (a merge's, with ``weights``)."""

    model: str
    kind: str
    parent: str | None
    parents: list[str]
    confidence: float
    weights: list[float] | None = None
    declared_relation: str | None = None
    declared_parents: list[str] = field(default_factory=list)
    agrees: bool = True
    copy_of: str | None = None  # the model (or the base) whose weights this one repeats, or re-saves in its dtype
    resaved: str | None = None  # a copy's dtype where it is a re-save (equal up to rounding), None: identical weights
    original_by: str | None = None  # why ``copy_of`` is the original (:mod:`modelvec.analyse.tree.copies`)
    #: why the node is placed as it is where the weights could not place it (no trace; a card's parent; a cycle)
    note: str | None = None
    method: str | None = None  # a merge's method as its weights tell it (:data:`~modelvec.analyse.tree.merges.METHODS`)
    #: the quantized types its weights were read in (a GGUF's ``Q4_K``...), None: float weights
    quantized: str | None = None

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "model": self.model,
            "parent": self.parent,
            "parents": list(self.parents),
            "kind": self.kind,
            "confidence": round(self.confidence, 3),
            "declared": {"relation": self.declared_relation, "parents": list(self.declared_parents)},
            "agrees": self.agrees,
        }
        if self.weights is not None:
            out["weights"] = [round(w, 3) for w in self.weights]
        if self.method is not None:
            out["method"] = self.method
        if self.copy_of is not None:
            out["copy_of"] = self.copy_of
            out["resaved"] = self.resaved
            out["original_by"] = self.original_by
        if self.note is not None:
            out["note"] = self.note
        if self.quantized is not None:
            out["quantized"] = self.quantized
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Node:
        """A node as :meth:`as_json` wrote it (a tree kept beside the store)."""
        declared = data.get("declared") or {}
        return cls(
            model=str(data["model"]),
            kind=str(data["kind"]),
            parent=data.get("parent"),
            parents=list(data.get("parents") or []),
            confidence=float(data["confidence"]),
            weights=list(data["weights"]) if data.get("weights") is not None else None,
            declared_relation=declared.get("relation"),
            declared_parents=list(declared.get("parents") or []),
            agrees=bool(data.get("agrees", True)),
            copy_of=data.get("copy_of"),
            resaved=data.get("resaved"),
            original_by=data.get("original_by"),
            note=data.get("note"),
            method=data.get("method"),
            quantized=data.get("quantized"),
        )


@dataclass
class Tree:
    """The inferred tree of one base's models (what a report adds to it, what was left out and why:
    :class:`modelvec.report.tree.TreeReport`)."""

    base: str
    nodes: list[Node]

    @property
    def partial(self) -> bool:
        """Whether some models have no trace: they, and their children, are placed by their cards at best."""
        return any(n.kind == "untraced" for n in self.nodes)

    def as_json(self) -> dict[str, Any]:
        return {
            "base": self.base,
            "models": [n.as_json() for n in self.nodes],
            "partial": self.partial,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Tree:
        """A tree as :meth:`as_json` wrote it (a report's fields, where a kept tree has them, are not the tree's)."""
        return cls(str(data["base"]), [Node.from_json(n) for n in data["models"]])

    def by_model(self) -> dict[str, Node]:
        return {n.model: n for n in self.nodes}

    def ordered(self) -> list[tuple[Node, int]]:
        """Every node with its depth below the base (1: a child of it), depth first, each under its parent (a merge
        under its heaviest one), so an indented list reads as the tree; unrelated weights, parentless, come last
        at depth 0, as does a node whose parent was not asked for."""
        children: dict[str | None, list[Node]] = {}
        known = {n.model for n in self.nodes}
        for n in self.nodes:
            up = n.parent if n.parent in known else (self.base if n.parent is not None else None)
            children.setdefault(up, []).append(n)
        out: list[tuple[Node, int]] = []
        placed: set[int] = set()  # each node once, whatever its parents say: the walk ends
        stack = [(n, 1) for n in reversed(children.get(self.base, []))]
        while stack:
            node, depth = stack.pop()
            if id(node) in placed:
                continue
            placed.add(id(node))
            out.append((node, depth))
            stack += [(c, depth + 1) for c in reversed(children.get(node.model, []))]
        return out + [(n, 0) for n in self.nodes if id(n) not in placed]
