"""Merges found in traces: which stored models a model is a combination of, and by which method (why each rule is
as it is, and what it was chosen on: docs/tree.md).

- **Entry by entry** first (:mod:`.entries`): a TIES or DARE merge holds each parent's delta, rescaled, exactly on
  the entries the others dropped, and their sum where all kept it; where each parent alone and the parents together
  explain a share of the merge's telling entries beyond chance (``dropped_share``), it is their merge.
- **Linear** (linear, task arithmetic, SLERP between nearby models): the trace is the parents' weighted sum, so a
  non-negative least-squares fit leaves less than ``merge_ratio`` of its least parent's residual alone; a merge
  saved in bf16 of finer parents may leave its rounding (``rounding``) where that explains it better than any one.
- **Trimmed, by the trace** (no entries kept, or too few that tell): fitted on the candidates that left
  ``trimmed_zeros`` fewer entries as the base's; a merge where the fit leaves under ``trimmed_ratio`` or its parents
  together explain ``trimmed_gain`` more than the best alone (a parent adding less is dropped); never on models that
  go beyond it as its fine-tunes would (``beyond``).

Candidates are the **primitive** models nearest in direction: those no other stored models explain as a merge (two
levels peeled: two merges of one pair explain each other), never near-duplicates (``duplicate``); a card naming two
or more stored parents is fitted first, so the weights check it. The method (``method``): from the entries,
``ties`` (a parent's dropped entries its smallest) or ``dare`` (as large as those kept); from the trace, ``ties``
or ``dare`` by what the fit leaves (``ties_ratio``), ``slerp`` (a lean along the base's weights beyond the weighted
sum), ``task_arithmetic`` (weights not summing to one), ``linear``; None where a trimmed fit leaves no more than the
rounding (a linear merge of deltas a bf16 step from the base looks trimmed).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .entries import EntryFit, EntryMerge
from .rule import TreeRule

METHODS = ("linear", "task_arithmetic", "slerp", "ties", "dare")
#: Significand bits of each float type (a precision's fineness).
_BITS = {"float64": 53, "float32": 24, "float16": 11, "bfloat16": 8}
#: Levels of merges peeled before a model is fitted on the primitives left (see :meth:`MergeFinder.explained`).
LEVELS = 2


@dataclass(frozen=True)
class Merge:
    """A model found to be a merge: its ``parents`` (indices of models; -1: the base, for one parent scaled down),
    their ``weights``, the ``confidence`` and the ``method`` the weights tell."""

    parents: list[int]
    weights: np.ndarray
    confidence: float
    method: str | None


@dataclass(frozen=True)
class _Fit:
    candidates: list[int]
    weights: np.ndarray
    residual: float
    singles: np.ndarray  # each candidate's own least residual (one non-negative multiple of it)
    target: float  # the model's own squared norm

    def ratio(self, kept: list[int]) -> float:
        """The fit's residual against the least of its ``kept`` parents' (positions in ``candidates``) alone: how much
        better the combination explains the model than any one of its parents does."""
        return self.residual / max(float(self.singles[kept].min()), 1e-300) if kept else 1.0

    def gain(self, kept: list[int]) -> float:
        """The share of what the fit explains that the best of its ``kept`` parents alone does not: unlike
        :meth:`ratio`, blind to what no combination explains (a DARE merge's drop noise), 0 for one parent."""
        if not kept:
            return 0.0
        explained = self.target - self.residual**2
        alone = self.target - float(self.singles[kept].min()) ** 2
        return max(0.0, 1.0 - alone / explained) if explained > 0 else 0.0


def margin(value: float, threshold: float) -> float:
    """A decision's confidence from how far its statistic is from the threshold: 0.5 on it, 1 at a factor of 2."""
    if value <= 0 or threshold <= 0:
        return 1.0
    return 0.5 + 0.5 * min(1.0, abs(math.log(value / threshold)) / math.log(2))


class MergeFinder:
    """Finds merges among one base's traces. ``dots(i)``: every trace's inner product with ``i``'s; ``products(rows)``:
    the inner products among ``rows``; ``usable``: which models may be a merge's parents (full models, no copies)."""

    def __init__(
        self,
        dots: Callable[[int], np.ndarray],
        products: Callable[[list[int]], np.ndarray],
        norms: np.ndarray,
        usable: np.ndarray,
        statistics: Mapping[str, Sequence[Any]],
        rule: TreeRule,
        scale: float = 0.0,
        near: Callable[[int], tuple[np.ndarray, np.ndarray]] | None = None,
        entries: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> None:
        """``statistics``: each trace's row statistics by name (``zeros``, ``zeros_bf16``, ``along``, ``precision``,
        ``rounding``; a missing one: none kept); ``scale``: the base's weights' size in the traces' map. ``near``:
        where every model's products are too many, a model's candidates (its nearest traces) and its products with
        them, the only models a merge is fitted on (``dots`` is then not asked). ``entries``: each trace's kept
        delta entries (rows, NaN: none) and the base's weights there (:mod:`.entries`; None: none kept)."""
        self.scale, self.near = scale, near
        self.dots, self.products, self.norms, self.usable, self.rule = dots, products, norms, usable, rule
        n = len(norms)

        def numbers(name: str) -> list[float | None]:
            return [None if v is None or v != v else float(v) for v in statistics.get(name) or [None] * n]

        self.zeros, self.zeros_bf16, self.along = numbers("zeros"), numbers("zeros_bf16"), numbers("along")
        self.rounding = numbers("rounding")
        self.precision = [p if isinstance(p, str) else None for p in statistics.get("precision") or [None] * n]
        self._explained: dict[tuple[int, int], bool] = {}
        self.entries = None
        if entries is not None and len(entries[1]) and len(entries[0]) == n:
            self.entries = EntryFit(entries[0], entries[1], self.precision, rule.dropped_share)

    def find(self, i: int, declared: Sequence[int] = ()) -> Merge | None:
        """Whether ``i`` is a merge, of which models and how: its declared parents where they fit, else fitted on the
        primitive models, else on every model (a merge of merges)."""
        if self.norms[i] == 0:
            return None
        if len(declared) >= 2 and all(self.usable[j] for j in declared):
            found = self._judge(i, list(declared))
            if found is not None:
                return found
        found = self._judge(i, self._near(i, LEVELS))
        return found if found is not None else self._judge(i, self._near(i, 0))

    def explained(self, j: int, level: int) -> bool:
        """Whether ``j`` is a merge of models not themselves explained at ``level`` - 1 (level 0: of any models):
        then it is no primitive, and no merge is fitted on it first. Two levels peel merges of the same parents
        (each explains the others as well as the parents do) and then trimmed merges (which a linear merge of
        their parents explains about as well as the parents do)."""
        if (j, level) not in self._explained:
            self._explained[(j, level)] = self._judge(j, self._near(j, level)) is not None
        return self._explained[(j, level)]

    def _near(self, i: int, level: int) -> list[int]:
        """The models nearest ``i`` in direction that may be its parents: usable, pointing its way, not
        near-duplicates of it, and (``level`` > 0) not explained at ``level`` - 1 as merges of others."""
        norms = self.norms
        if self.near is not None:  # its nearest traces alone
            cols, dots = self.near(i)
            cos = dots / np.maximum(norms[cols] * norms[i], 1e-300)
            ok = self.usable[cols] & (cos > 0) & (cos < self.rule.duplicate) & (cols != i)
            order = np.argsort(-cos[ok], kind="stable")
            return self._primitive(cols[ok][order], level)
        cos = self.dots(i) / np.maximum(norms * norms[i], 1e-300)
        ok = self.usable & (cos > 0) & (cos < self.rule.duplicate)
        ok[i] = False
        k = self.rule.merge_candidates
        found = np.flatnonzero(ok)
        if len(found) > 2 * k:  # the 2k nearest, without sorting every model
            found = found[np.argpartition(-cos[found], 2 * k - 1)[: 2 * k]]
        return self._primitive(found[np.argsort(-cos[found], kind="stable")], level)

    def _primitive(self, nearest: np.ndarray, level: int) -> list[int]:
        """The first ``merge_candidates`` of ``nearest`` (nearest first) not explained at ``level`` - 1, asked of the
        2k nearest only (each answer is a fit of its own)."""
        k = self.rule.merge_candidates
        order = [int(j) for j in nearest[: 2 * k]]
        if level > 0:
            order = [j for j in order if not self.explained(j, level - 1)]
        return order[:k]

    def _fit(self, i: int, candidates: list[int]) -> _Fit:
        gram, dots, target = self.products(candidates), self._dots(i, candidates), float(self.norms[i] ** 2)
        weights, residual, _ = nnls_from_products(gram, dots, target)
        singles = np.sqrt(np.maximum(target - np.maximum(dots, 0) ** 2 / np.maximum(np.diag(gram), 1e-300), 0.0))
        return _Fit(candidates, weights, residual, singles, target)

    def _judge(self, i: int, candidates: list[int]) -> Merge | None:
        """``i`` as a merge of ``candidates``: a fit that leaves little (``merge_ratio``), a linear merge; else, on
        the candidates stored finer than ``i`` (a bf16 merge of float32 models), a fit that leaves no more than the
        rounding to ``i``'s precision; else, on the candidates that left far fewer entries as the base's than ``i``
        did, a fit that leaves somewhat more (``trimmed_ratio``) or whose parents each explain a share more
        (``trimmed_gain``), a TIES or DARE merge; None where none holds."""
        if not candidates:
            return None
        if self.entries is not None and (entry := self.entries.fit(i, candidates)) is not None:
            return self._by_entries(i, entry)
        rule = self.rule
        found = self._merge(i, self._fit(i, candidates), rule.merge_ratio, trimmed=False)
        finer = [j for j in candidates if self._finer(j, i)]
        if found is None and finer and self.rounding[i]:
            found = self._merge(i, self._fit(i, finer), rule.trimmed_ratio, trimmed=False, within=self._allowed(i))
        mine = self.zeros[i]
        if found is not None or mine is None:
            return found
        theirs = self.zeros_bf16 if self.precision[i] == "bfloat16" else self.zeros  # in the merge's own precision
        beyond = dict(zip(candidates, self._beyond(i, candidates)))
        fewer = [
            j for j in candidates if (z := theirs[j]) is not None and z <= mine - rule.trimmed_zeros and not beyond[j]
        ]
        if not fewer:
            return None
        fit = self._pruned(i, self._fit(i, fewer))
        return self._merge(i, fit, rule.trimmed_ratio, trimmed=True, gain=rule.trimmed_gain)

    def _by_entries(self, i: int, found: EntryMerge) -> Merge:
        """A merge found entry by entry (:mod:`.entries`): its parents, their weights the trace's fit on them (what
        a child of it holds of each), its confidence the nearer of its two shares to ``dropped_share``."""
        least = self.rule.dropped_share
        weights = self._fit(i, found.parents).weights
        confidence = min(margin(v, least) for v in (found.alone, found.gain, found.together))
        return Merge(list(found.parents), np.asarray(weights, np.float64), confidence, found.method)

    def _dots(self, i: int, cols: Sequence[int]) -> np.ndarray:
        """``i``'s trace's inner products with those of ``cols``."""
        if self.near is None:
            return self.dots(i)[list(cols)]
        near, dots = self.near(i)  # its nearest's products are known; any other's computed
        at = np.searchsorted(near, cols)
        known = (at < len(near)) & (near[np.minimum(at, len(near) - 1)] == np.asarray(cols, np.int64))
        out = np.where(known, dots[np.minimum(at, len(near) - 1)], 0.0) if len(near) else np.zeros(len(cols))
        if not known.all():
            others = [int(c) for c, k in zip(cols, known) if not k]
            out[~known] = self.products([i, *others])[0, 1:]
        return out

    def _beyond(self, i: int, cols: Sequence[int]) -> np.ndarray:
        """Which models go beyond ``i`` as its fine-tune would (hold its whole delta, ``TreeRule.beyond``, and are
        larger): a later fine-tune of it or a merge of it, never a trimmed merge's parent, which holds a part of the
        merge, its drop noise and rescale added (a chain's first member, leaving more entries as the base's than
        its descendants do, was fitted on them)."""
        lo, hi = self.rule.beyond
        share = self._dots(i, cols) / max(float(self.norms[i]) ** 2, 1e-300)
        return (share >= lo) & (share <= hi) & (self.norms[list(cols)] > self.norms[i])

    def _pruned(self, i: int, fit: _Fit) -> _Fit:
        """A trimmed fit without the parents that add less than ``trimmed_gain`` of what it explains to what the
        others explain, the least first, while more than two are left: a trimmed merge's noise lets a model that
        holds a share of its parents (an unrecognised merge of one of them) take a small weight beside them."""
        least = self.rule.merge_weight
        while True:
            kept = [k for k, w in enumerate(fit.weights) if w >= least]
            if len(kept) <= 2:
                return fit
            explained = fit.target - fit.residual**2
            without = [self._fit(i, [fit.candidates[m] for m in kept if m != k]) for k in kept]
            adds = [1 - (fit.target - w.residual**2) / explained if explained > 0 else 0.0 for w in without]
            weakest = int(np.argmin(adds))
            if adds[weakest] >= self.rule.trimmed_gain:
                return fit
            fit = without[weakest]

    def _merge(
        self,
        i: int,
        fit: _Fit,
        threshold: float,
        *,
        trimmed: bool,
        within: float | None = None,
        gain: float | None = None,
    ) -> Merge | None:
        """A fit as a merge (two or more parents of weight at least ``merge_weight``, or one scaled down with the
        base) where it leaves less than ``threshold`` of the least residual of one of those parents alone (and,
        ``within``, no more than that: the rounding expected of it), or (``gain``) where those parents together
        explain at least that share more than the best of them alone; else None."""
        rule = self.rule
        at = [k for k, w in enumerate(fit.weights) if w >= rule.merge_weight]
        kept = [(fit.candidates[k], float(fit.weights[k])) for k in at]
        total = sum(w for _, w in kept)
        if len(kept) == 1 and total < 1 - rule.merge_weight:  # one model scaled down: merged with the base
            kept.append((-1, 1 - total))
        ratio, gained, least = fit.ratio(at), fit.gain(at), 1.0 if gain is None else gain
        by_ratio, by_gain = ratio < threshold, gain is not None and gained >= least
        if len(kept) < 2 or not (by_ratio or by_gain) or (within is not None and fit.residual > within):
            return None
        if within is not None:
            confidence = margin(fit.residual, within)
        else:
            confidence = max(margin(ratio, threshold) if by_ratio else 0.0, margin(gained, least) if by_gain else 0.0)
        parents, weights = [j for j, _ in kept], np.array([w for _, w in kept])
        method = self._method(i, parents, weights, ratio, trimmed=trimmed, residual=fit.residual)
        return Merge(parents, weights, confidence, method)

    def _allowed(self, i: int) -> float:
        """What a fit of ``i`` may leave and still be no more than its rounding to its own precision: ``rounding``
        times its expected size (0 where none was kept)."""
        return self.rule.rounding * float(self.rounding[i] or 0.0) * self.scale

    def _finer(self, j: int, i: int) -> bool:
        """Whether ``j`` is stored in a finer precision than ``i`` (float32 beside a bf16 merge): only then is ``i``'s
        rounding what ``j`` does not have; among models of one precision a direct fine-tune is rounded as much as a
        merge, and a fit that leaves only that much tells them apart from nothing."""
        mine = _BITS.get(self.precision[i] or "", 0)
        return bool(mine) and _BITS.get(self.precision[j] or "", 0) > mine

    def _method(
        self, i: int, parents: list[int], weights: np.ndarray, ratio: float, *, trimmed: bool, residual: float
    ) -> str | None:
        """What the weights tell of the merge's method (see the module docstring); None where they cannot tell: a
        trimmed fit that leaves no more than the rounding to the merge's precision may be a linear merge whose
        rounding put entries back to the base's (parents a bf16 step or so from the base), not a trimmed one."""
        rule = self.rule
        if trimmed:
            if residual <= self._allowed(i):
                return None
            return "ties" if ratio < rule.ties_ratio else "dare"
        along = [0.0 if j < 0 else self.along[j] for j in parents]
        mine = self.along[i]
        if mine is not None and all(a is not None for a in along):
            excess = mine - float(sum(w * a for w, a in zip(weights, along) if a is not None))
            if excess > rule.slerp_excess:
                return "slerp"
        return "linear" if abs(float(weights.sum()) - 1) <= rule.weights_sum else "task_arithmetic"


def nnls_from_products(gram: np.ndarray, dots: np.ndarray, target_sq: float) -> tuple[np.ndarray, float, float]:
    """The non-negative least-squares fit of a target on k traces from their inner products alone (k x k, not k x
    16,384): (weights, residual, the least residual of one non-negative multiple of a single trace).

    With G = V diag(s) V^T (s > 0 kept: G may be singular, two traces alike), A w lies in the span of V, so
    |A w - b|^2 = |diag(sqrt s) V^T w - c|^2 + |b|^2 - |c|^2 with c = diag(1/sqrt s) V^T A^T b: a k x k NNLS."""
    from scipy.optimize import nnls

    values, vectors = np.linalg.eigh(gram)
    keep = values > 1e-10 * max(float(values.max()), 1e-300)
    root = np.sqrt(values[keep])
    c = (vectors[:, keep].T @ dots) / root
    weights, rnorm = nnls(root[:, None] * vectors[:, keep].T, c)
    residual = float(np.sqrt(max(rnorm**2 + target_sq - float(c @ c), 0.0)))
    diag = np.maximum(np.diag(gram), 1e-300)
    single = float(np.sqrt(max(float(np.min(target_sq - np.maximum(dots, 0) ** 2 / diag)), 0.0)))
    return weights, residual, single
