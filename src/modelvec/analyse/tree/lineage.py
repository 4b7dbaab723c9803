"""The model tree inferred from the weights: each stored model's parent and kind, from its trace alone (:mod:`.nodes`).

A trace (:mod:`modelvec.represent.trace`) is a sketch of the rows read of W_model - W_base, linear in the weights,
its size beside the base's, and how many distinct values its rows hold. What each kind leaves in it:

- **unrelated** weights with the base's shapes: a delta as large as the weights (about sqrt(2) x the base's);
- a **quantization**'s round trip (int8, 4-bit, dequantized and re-uploaded): few distinct values a row;
- a **merge** (a weighted average of models, mergekit's linear): its trace is its parents' weighted sum, so a
  non-negative least-squares fit on two or more other models leaves almost nothing, far less than the best one;
- a **fine-tune** of a model starts from that model's weights: its delta goes *beyond* its parent's, so the
  share of the parent's delta it holds (T_m . T_p / |T_p|^2) is about 1, and its parent is the nearest model that
  it goes beyond (the base, T = 0, always does): siblings share a direction but hold less than all of each other;
- an **adapter** is known from its files; its parent is the fine-tune it was embedded on, or else found as a
  fine-tune's is;
- a **copy** of the base (a re-upload of it, an untrained adapter) has a zero trace: the base is its parent, and it
  is nobody's; a model that repeats another's trace bit for bit is a copy of that model.

The tree is acyclic by construction, whatever the traces: a parent that would make a model its own ancestor is
refused and the model placed under the base (:func:`~modelvec.analyse.tree.placement.acyclic`). A model without a
trace (stored before traces were kept, or its trace damaged) is a node of kind ``untraced`` with the reason and the
remedy; a traced model whose card names it is placed under it where the weights find no other parent, and the tree
says it is partial (:mod:`modelvec.analyse.tree.placement`).

Each threshold is a field of :class:`TreeRule`, chosen on the selection half of the tree evidence zoo
(docs/tree.md). Numpy and scipy only: the tree of a stored population needs no torch.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np
import xxhash

from .copies import Copy, Traced, find_copies, mini_of
from .merges import Merge, MergeFinder, margin
from .nodes import Node, Tree
from .placement import acyclic, compare, declared_merges, under_untraced, untraced_node
from .rule import TreeRule

#: Models up to which the whole tree's inner products are made at once (16,384 x 16,384 float32: 1 GiB; 10,000
#: models: 0.4 GB and 7.7 s on 2 cores, one symmetric product).
GRAM_UP_TO = 16384
#: Above :data:`GRAM_UP_TO`, a model's parents are looked for among its nearest traces: these many by distance and
#: as many by cosine (:func:`~modelvec.analyse.graph.nearest_rows`; each pair's product once, no n x n held). A
#: fine-tune's parent is the nearest model it goes beyond, a merge's parents the traces it leans along most.
TREE_NEAR = 64


def infer_tree(
    base: str,
    models: Sequence[str],
    sketches: np.ndarray | Sequence[np.ndarray],
    scale: float,
    levels: Sequence[float | None],
    *,
    adapters: Mapping[str, str | None] | None = None,
    declared: Mapping[str, tuple[str | None, list[str]]] | None = None,
    base_names: Sequence[str] = (),
    rule: TreeRule | None = None,
    only: Sequence[str] | None = None,
    untraced: Mapping[str, str] | None = None,
    statistics: Mapping[str, Sequence[Any]] | None = None,
    quantized: Collection[str] = (),
    copies: Mapping[str, Copy] | None = None,
    entries: tuple[np.ndarray, np.ndarray] | None = None,
) -> Tree:
    """The tree of ``models`` (traces ``sketches``, one row each; ``scale``: the base's size; ``levels``) under
    ``base``. ``adapters``: the adapters, each with the model it was embedded on (None: the base); ``declared``:
    what cards say, (relation, parents); ``base_names``: other names of the base in ``declared``; ``only``: the
    models whose nodes are wanted (a neighbour query's one: a pass over the others, not all pairs); ``untraced``:
    the models without a trace, each with why (and what to do), placed by their cards where those name a model;
    ``statistics``: each trace's row statistics by name (``zeros``, ``zeros_bf16``, ``along``, ``precision``: see
    :class:`~modelvec.represent.trace.Trace`; missing or None: not kept, as in a store written before traces were);
    ``quantized``: the models known from their files to be quantizations (GGUF, GPTQ, AWQ, bitsandbytes); ``copies``:
    the copies among the models, each with its
    original (:mod:`modelvec.analyse.tree.copies`; a population's, which reads the cards), default found from the traces
    alone; ``entries``: each trace's kept delta entries (rows; NaN: none) and the base's weights there, on which a
    trimmed merge is fitted entry by entry (:mod:`modelvec.analyse.tree.entries`; None: none kept)."""
    adapters, untraced, declared = dict(adapters or {}), dict(untraced or {}), dict(declared or {})
    t = np.asarray(sketches if isinstance(sketches, np.ndarray) else np.stack(list(sketches)), np.float32)
    t = t.reshape(len(models), -1) if len(models) else np.zeros((0, 1), np.float32)
    stats = {k: list(v) for k, v in (statistics or {}).items()}
    known = {**{m: "quantization" for m in quantized}, **{m: "adapter" for m in adapters}}
    rule = rule or TreeRule()
    if copies is None:
        copies = copies_in(models, t, scale, stats, known, base, rule)
    inference = _Inference(models, t, scale, levels, stats, rule, known, only is None, copies, entries)
    inference.declared = declared_merges(declared, inference.index)
    wanted = [inference.index[m] for m in only if m in inference.index] if only is not None else range(len(models))
    nodes = [inference.node(i, base, adapters.get(models[i])) for i in wanted]
    root = {base.lower(), *(a.lower() for a in base_names)}
    nodes += [untraced_node(m, why, base, root, declared) for m, why in untraced.items() if only is None or m in only]
    under_untraced(nodes, untraced, declared, base, root)
    acyclic(nodes, base)
    compare(nodes, base, root, declared)
    return Tree(base, nodes)


def gram_of(t: np.ndarray) -> np.ndarray:
    """``t t^T`` in float32 (the traces' own precision, half the memory): one symmetric product (BLAS syrk, half a
    general product's work), its lower triangle filled a block of rows at a time, in place."""
    from scipy.linalg.blas import ssyrk

    t32 = np.ascontiguousarray(t, dtype=np.float32)
    g = ssyrk(1.0, t32.T, trans=1)  # t32.T is Fortran-ordered: no copy; the upper triangle of t t^T
    for lo in range(0, len(g), 1024):
        hi = min(lo + 1024, len(g))
        g[lo:hi, :lo] = g[:lo, lo:hi].T
        block = g[lo:hi, lo:hi]
        block[np.tril_indices(hi - lo, -1)] = block.T[np.tril_indices(hi - lo, -1)]
    return g.T  # the same matrix (symmetric), its rows contiguous


def copies_in(
    models: Sequence[str],
    t: np.ndarray,
    scale: float,
    stats: Mapping[str, Sequence[Any]],
    known: Mapping[str, str],
    base: str,
    rule: TreeRule,
) -> dict[str, Copy]:
    """The copies among traces alone (no card, no date: where nothing else tells an original, the finer dtype, then
    the first by name): identical traces, zero ones, and re-saves within their dtype's rounding."""
    norms = np.sqrt(np.einsum("ij,ij->i", t, t, dtype=np.float64))
    precision = [p if isinstance(p, str) else None for p in stats.get("precision") or [None] * len(models)]
    rounding = [None if v is None or v != v else float(v) for v in stats.get("rounding") or [None] * len(models)]
    same = [None if v is None or v != v else float(v) for v in stats.get("zeros") or [None] * len(models)]
    traced = Traced(
        models=models,
        digest=[xxhash.xxh3_64_hexdigest(row.tobytes()) for row in t],
        zero=[bool(v == 0) for v in norms],
        norm=[float(v) for v in norms],
        precision=precision,
        rounding=rounding,
        same=same,
        resaved=[m not in known for m in models],
        scale=scale,
        mini=[mini_of(row) for row in t],
    )
    distance = lambda pairs: np.array([float(np.linalg.norm(t[i].astype(np.float64) - t[j])) for i, j in pairs])
    return find_copies(traced, distance, base=base, rule=rule)


class _Inference:
    """The traces of one base's models and what is decided of them, each merge fit made once when first asked."""

    def __init__(
        self,
        models: Sequence[str],
        t: np.ndarray,
        scale: float,
        levels: Sequence[float | None],
        stats: Mapping[str, Sequence[Any]],
        rule: TreeRule,
        known: Mapping[str, str],
        every: bool = True,
        copies: Mapping[str, Copy] | None = None,
        entries: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> None:
        self.models, self.t, self.rule, self.all = list(models), t, rule, every
        self.index = {m: i for i, m in enumerate(self.models)}
        self.norms = np.sqrt(np.einsum("ij,ij->i", t, t, dtype=np.float64))
        self.size = self.norms / scale if scale > 0 else np.zeros(len(models))
        self.levels = [None if lv is None or math.isnan(lv) else float(lv) for lv in levels]
        self.kind = ["fine-tune"] * len(models)
        self.confidence = np.ones(len(models))
        for i in range(len(models)):
            lv = self.levels[i]
            if (
                self.models[i] in known
            ):  # known from its files: an adapter, a quantization (GGUF, GPTQ, AWQ, bitsandbytes)
                self.kind[i] = known[self.models[i]]
            elif self.size[i] > rule.unrelated_size:
                self.kind[i], self.confidence[i] = "unrelated", margin(self.size[i], rule.unrelated_size)
            elif lv is not None and lv < rule.quantized_levels:
                self.kind[i], self.confidence[i] = "quantization", margin(lv, rule.quantized_levels)
            else:
                self.confidence[i] = min(
                    margin(self.size[i], rule.unrelated_size), margin(lv or 1.0, rule.quantized_levels)
                )
        self._merges: dict[int, Merge | None] = {}
        self._gram: np.ndarray | None = None
        #: above GRAM_UP_TO, each model's nearest traces and its products with them
        self._near: np.ndarray | None = None
        self._near_dots = np.zeros((0, 0))
        #: the copies (identical weights, re-saves) among the models: never a parent of anything, never a merge's
        self.copies = {self.index[m]: c for m, c in (copies or {}).items() if m in self.index}
        usable = np.array([k == "fine-tune" for k in self.kind], dtype=bool) & (self.norms > 0)
        usable[list(self.copies)] = False  # a copy would share its original's weight; its original stands for it
        self.parentable = usable  # full models (merges among them) that may be a model's parent
        #: above GRAM_UP_TO where every node is asked for: each model's nearest traces are its only candidates
        self.listed = every and len(models) > GRAM_UP_TO
        near = self.near if self.listed else None
        self.finder = MergeFinder(
            self.dots, self._products, self.norms, usable, stats, rule, scale, near=near, entries=entries
        )
        self.declared: dict[int, list[int]] = {}  # merges whose cards name stored parents: fitted on them first

    def dots(self, i: int) -> np.ndarray:
        """Every trace's inner product with ``i``'s: from the Gram matrix, made once where every node is asked for
        (and it fits: :data:`GRAM_UP_TO` models), else one pass over the traces (above it, where every node is asked
        for, :meth:`near` stands for this)."""
        if self._gram is None and self.all and len(self.models) <= GRAM_UP_TO:
            self._gram = gram_of(self.t)
        return (self._gram[i] if self._gram is not None else self.t @ self.t[i]).astype(np.float64)

    def near(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """``i``'s nearest traces (:data:`TREE_NEAR` by distance and as many by cosine, each pair's product once for
        the whole tree: :func:`~modelvec.analyse.graph.nearest_rows`) and its inner products with them."""
        if self._near is None:
            from ..graph import nearest_rows

            self._near, self._near_dots = nearest_rows(self.t, TREE_NEAR)
        cols, at = np.unique(self._near[i], return_index=True)
        keep = cols >= 0
        return cols[keep], self._near_dots[i][at[keep]]

    def node(self, i: int, base: str, embedded_on: str | None) -> Node:
        m, kind = self.models[i], self.kind[i]
        if i in self.copies:  # identical weights or a re-save: placed under its original, never a fine-tune
            c = self.copies[i]
            node = Node(model=m, kind="copy", parent=c.original, parents=[c.original], confidence=1.0)
            node.copy_of, node.resaved, node.original_by = c.original, None if c.exact else c.precision, c.chosen_by
        elif kind == "unrelated":
            node = Node(model=m, kind="unrelated", parent=None, parents=[], confidence=float(self.confidence[i]))
        elif (merge := self.merge(i)) is not None:
            order = np.argsort(merge.weights)[::-1]
            names = [base if merge.parents[j] < 0 else self.models[merge.parents[j]] for j in order]
            node = Node(
                model=m,
                kind="merge",
                parent=names[0],
                parents=names,
                confidence=merge.confidence,
                weights=[float(merge.weights[j]) for j in order],
                method=merge.method,
            )
        elif kind == "adapter":  # on the model its config names, as it was embedded: known from its files
            parent = embedded_on if embedded_on is not None and embedded_on in self.index else base
            node = Node(model=m, kind=kind, parent=parent, parents=[parent], confidence=1.0)
        else:
            j, conf, runner = self.parent(i)
            parent = base if j < 0 else self.models[j]
            node = Node(
                model=m, kind=kind, parent=parent, parents=[parent], confidence=float(min(self.confidence[i], conf))
            )
            if kind == "quantization" and runner is not None and conf < self.rule.quantized_sure:
                near = base if runner < 0 else self.models[runner]
                node.note = f"unsure: {near} is about as near (its rounding hides which of the two it rounds)"
        return node

    def merge(self, i: int) -> Merge | None:
        """Whether ``i`` is a merge of stored models (:mod:`modelvec.analyse.tree.merges`); fitted once, when first
        asked."""
        if i not in self._merges:
            self._merges[i] = self.finder.find(i, self.declared.get(i, ())) if self.kind[i] == "fine-tune" else None
        return self._merges[i]

    def _products(self, rows: list[int]) -> np.ndarray:
        """The inner products among ``rows``' traces (float64), from the Gram matrix where it was made."""
        if self._gram is not None:
            return self._gram[np.ix_(rows, rows)].astype(np.float64)
        part = self.t[rows]
        return (part @ part.T).astype(np.float64)

    def parent(self, i: int) -> tuple[int, float, int | None]:
        """The nearest model that ``i`` goes beyond (-1: the base), how clearly it is nearer than the next, and the next
        (None: no other).

        A quantization's rounding is far larger than a fine-tune's delta (4 bits: about 20 times), so the share of
        its parent's delta it holds is lost in it: its parent is the nearest model, the rounding the same
        distance from every candidate."""
        norms = self.norms
        lo, hi = self.rule.beyond
        cols, dots = self.near(i) if self.listed else (np.arange(len(norms)), self.dots(i))
        share = dots / np.maximum(norms[cols] ** 2, 1e-300)
        distance = np.sqrt(np.maximum(norms[i] ** 2 + norms[cols] ** 2 - 2 * dots, 0))
        can = self.parentable[cols] & (cols != i)
        if self.kind[i] != "quantization":
            can &= (norms[cols] < norms[i]) & (share >= lo) & (share <= hi)
        best: list[tuple[float, int]] = [(float(norms[i]), -1)]  # the base: T = 0, always gone beyond
        found = np.flatnonzero(can)
        held = dict(zip(cols.tolist(), share.tolist()))
        for at in found[np.argsort(distance[found], kind="stable")]:  # nearest first: the two nearest that qualify
            j = int(cols[at])
            merge = self.merge(j) if self.kind[i] != "quantization" else None  # a quantization: the nearest
            if merge is not None and not self._holds(i, merge, held):
                continue  # a merge is a parent only of a model that holds each of its parents' deltas in full
            best.append((float(distance[at]), j))
            if len(best) == 3:
                break
        best.sort()
        if len(best) == 1:
            return -1, 1.0, None
        return best[0][1], margin(best[1][0], best[0][0]) if best[0][0] > 0 else 1.0, best[1][1]

    def _holds(self, i: int, merge: Merge, held: dict[int, float]) -> bool:
        """Whether ``i`` holds each of ``merge``'s parents' deltas at least at its weight in the merge (its child
        does; a sibling of one parent holds that one's direction and none of the others'); never a parent's own.
        ``held``: the share of each model's delta ``i`` holds, where known (else from their products)."""
        lo = self.rule.beyond[0]
        if i in merge.parents:
            return False
        for j, w in zip(merge.parents, merge.weights):
            if j < 0:
                continue
            share = held.get(j)
            if share is None:
                share = float(self._products([i, j])[0, 1]) / max(float(self.norms[j]) ** 2, 1e-300)
            if share < lo * w:
                return False
        return True
