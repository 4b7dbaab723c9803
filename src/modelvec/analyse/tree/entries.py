"""A TIES or DARE merge found entry by entry: which of its parents' deltas each entry of its own delta holds.

Each trace keeps a few raw entries of the model's delta and the base's weights there (:data:`GROUP` consecutive
ones of a matrix at a time). A trimmed merge is no weighted average: DARE keeps each entry of each parent's delta
with probability d and rescales it (1/d), TIES keeps the largest; signs are elected and ``normalize`` divides by the
weights kept. So each entry of the merge's delta is *exactly* one of a few sums, that of the parents that kept it,
each delta times a coefficient, or zero; where one parent alone kept it, that parent's delta times one constant:
their ratios pile up on it, a spike no fine-tune, sibling or linear merge shows.

:class:`EntryFit` finds each candidate's spike, then counts the entries each subset of the parents explains within
the merge's rounding (half a unit in its last place; the base's and a finer parent's rounding to its dtype; a
relative slack for the rescale's spread over matrices and the arithmetic in its dtype), less chance: the count with
every coefficient scaled a few slacks off, which an entry too coarse to tell them apart (a delta of a few bf16
steps) matches alike. Only entries where the merge's delta is :data:`TELLING` times its rounding count. A merge is
named where each parent alone explains ``TreeRule.dropped_share`` of the entries the others' deltas tell on and no
other parent alone explains (they dropped them), and the parents' sums as much that no one of them explains (the
entries all kept: a parent of several trimmed merges shares with each the entries it kept alone, never their sum).
Its method: ``ties`` where a parent's dropped entries are its smallest, ``dare`` where they are as large as the rest.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .copies import BITS

#: Consecutive kept entries from one matrix: a trace keeps a multiple of this many of each (the method's magnitude
#: test compares a parent's entries within one such group).
GROUP = 16
#: An entry tells where the merge's delta is at least this many times its rounding (the rest is chance).
TELLING = 4.0
#: The least telling entries a fit is made on, and the most telling ones a candidate is screened on first.
LEAST_ENTRIES, QUICK = 64, 384
#: The candidates (nearest first) whose spikes are looked for, and the most parents of one merge.
CANDIDATES, MOST_PARENTS = 8, 4
#: The scalings (in steps of a merge's band, four times its relative slack) of the predictions that count chance.
BANDS = (-2.0, -1.0, 1.0, 2.0)
#: Above this rank statistic a parent's dropped entries are its smallest: TIES' magnitude trimming.
TRIMMED_AUC = 0.75


@dataclass(frozen=True)
class EntryMerge:
    """A merge found entry by entry: its ``parents`` (model indices), the share of its telling entries they explain
    beyond chance (``explained``) and beyond the best of them alone (``gain``), the least share one parent alone
    explains where the others tell (``alone``), the share only their sums explain (``together``) and the
    ``method`` (``ties`` or ``dare``)."""

    parents: list[int]
    explained: float
    gain: float
    alone: float
    together: float
    method: str


@dataclass(frozen=True)
class _Merge:
    """What one model's entries say as a merge: its delta, its rounding (``half``), the base's (``base``), the
    relative slack and the band (the step of the coefficients chance is counted at), which entries tell, and its
    significand bits."""

    delta: np.ndarray
    half: np.ndarray
    base: np.ndarray
    slack: float
    band: float
    telling: np.ndarray
    bits: int


class EntryFit:
    """Fits models as trimmed merges of others entry by entry. ``entries``: each model's kept delta entries (rows;
    NaN: none kept), ``base``: the base's weights at them, ``precision``: each model's stored dtype."""

    def __init__(self, entries: np.ndarray, base: np.ndarray, precision: Sequence[str | None], least: float) -> None:
        self.entries, self.b = np.asarray(entries, np.float32), np.asarray(base, np.float64)
        self.precision, self.least = list(precision), least
        n = len(self.precision)
        self.kept = np.zeros(n, bool)
        if self.entries.size:
            self.kept = np.asarray(~np.isnan(self.entries).any(axis=1), bool)
        self.base_bits = _bits_of(self.b)
        self._merges: dict[int, _Merge | None] = {}
        self._singles: dict[tuple[int, int], tuple[float, float]] = {}
        self._quick: dict[int, tuple[_Merge, np.ndarray]] = {}

    def fit(self, i: int, candidates: Sequence[int]) -> EntryMerge | None:
        """``i`` as a trimmed merge of some of ``candidates`` (nearest first): None where no two of them explain it
        entry by entry (or ``i``'s entries do not tell).

        Each parent alone must explain a share of the entries the others' deltas tell on (they dropped them), and
        the parents together a share no one of them explains (the entries they all kept): a parent of several
        trimmed merges shares with each the entries it kept alone, so it is explained by each alone, never by their
        sum."""
        m = self._merge(i)
        if m is None:
            return None
        cands = self._screened(i, [j for j in candidates if j != i and self.kept[j]][:CANDIDATES])
        singles = {j: self._singles[(i, j)] for j in cands}
        ranked = sorted((j for j in cands if singles[j][1] >= self.least / 2), key=lambda j: -singles[j][1])
        if len(ranked) < 2:
            return None
        best, score = None, (-1.0, 0.0)
        for pair in itertools.combinations(ranked[:4], 2):
            value = self._explained(m, list(pair), [singles[p][0] for p in pair])
            if value[0] > score[0]:
                best, score = list(pair), value
        assert best is not None
        for j in ranked:
            if j in best or len(best) >= MOST_PARENTS:
                continue
            more = [*best, j]
            value = self._explained(m, more, [singles[p][0] for p in more])
            if value[0] - score[0] >= self.least:
                best, score = more, value
        alone = [self._alone(m, j, {o: singles[o][0] for o in best if o != j}, singles[j][0]) for j in best]
        gain = score[0] - max(singles[j][1] for j in best)
        if min(gain, score[1], *alone) < self.least:
            return None
        method = self._method(m, best, [singles[p][0] for p in best])
        return EntryMerge(best, score[0], gain, min(alone), score[1], method)

    def _merge(self, i: int) -> _Merge | None:
        """Model ``i``'s entries as a merge's (None: none kept, an unknown dtype, or too few that tell)."""
        if i not in self._merges:
            self._merges[i] = None
            bits = BITS.get(self.precision[i] or "", 0)
            if self.kept[i] and bits and len(self.b) == self.entries.shape[1]:
                delta = self.entries[i].astype(np.float64)
                half = 0.5 * ulp(self.b + delta, bits)
                base = 0.5 * ulp(self.b, bits) if self.base_bits > bits else np.zeros_like(half)
                telling = np.abs(delta) >= TELLING * (half + base) + 1e-30
                if int(telling.sum()) >= LEAST_ENTRIES:
                    slack = max(1 / 128, 5 * 2.0**-bits)
                    m = _Merge(delta, half, base, slack, 4 * slack, telling, bits)
                    self._merges[i] = m
                    sharp = np.where(telling, np.abs(delta) / (half + base + 1e-300), 0.0)
                    at = np.sort(np.argsort(-sharp, kind="stable")[:QUICK])
                    self._quick[i] = (_Merge(delta[at], half[at], base[at], slack, 4 * slack, telling[at], bits), at)
        return self._merges[i]

    def _delta(self, j: int) -> np.ndarray:
        return self.entries[j].astype(np.float64)

    def _error(self, m: _Merge, j: int, at: np.ndarray | None = None) -> np.ndarray:
        """How far the merge's view of ``j``'s delta may be from the kept one: ``j``'s and the base's rounding to the
        merge's dtype, where they are stored finer (mergekit computes in the merge's dtype); ``at``: at those
        entries of ``m``'s (a :data:`QUICK` screen's)."""
        base = m.base if at is None else m.base[at]
        if BITS.get(self.precision[j] or "", 53) <= m.bits:
            return base
        b = self.b if at is None else self.b[at]
        dj = self._delta(j) if at is None else self.entries[j, at].astype(np.float64)
        return base + 0.5 * ulp(b + dj, m.bits)

    def _screened(self, i: int, cands: list[int]) -> list[int]:
        """Each candidate's coefficient in ``i`` where it alone kept an entry (the spike of their ratios) and the
        share of ``i``'s telling entries it explains so beyond chance, all at once: first on ``i``'s :data:`QUICK` most telling entries, where
        one that explains under half of ``dropped_share`` alone beyond chance is no parent (a fine-tune's every
        candidate, most of a merge's), then on every entry; the candidates whose ratios show a spike."""
        todo = [j for j in cands if (i, j) not in self._singles]
        if todo:
            m = self._merge(i)
            assert m is not None
            quick, at = self._quick[i]
            rows = np.asarray(todo, np.int64)
            errors = np.stack([self._error(m, j, at) for j in todo])
            _, shares = _screen(quick, self.entries[np.ix_(rows, at)].astype(np.float64), errors)
            for j, share in zip(todo, shares):
                if share < self.least / 2:
                    self._singles[(i, j)] = (0.0, float(share))
            more = [j for j in todo if (i, j) not in self._singles]
            if more:
                errors = np.stack([self._error(m, j) for j in more])
                found = _screen(m, self.entries[np.asarray(more, np.int64)].astype(np.float64), errors)
                for j, c, share in zip(more, *found):
                    self._singles[(i, j)] = (float(c), float(share))
        return [j for j in cands if self._singles[(i, j)][0] > 0]

    def _alone(self, m: _Merge, j: int, others: dict[int, float], coefficient: float) -> float:
        """The share of the merge's telling entries ``j`` alone explains beyond chance where every other parent's
        delta tells too and none of them alone explains it: those the others dropped (an entry a parent left as the
        base's drops nothing; a linear merge of parents that left some is one of them there; a model equal to a
        parent on some entries explains those as that parent does)."""
        where = m.telling.copy()
        for o, c in others.items():
            do, err = self._delta(o), self._error(m, o)
            where &= np.abs(do) >= TELLING * (m.half + err) + 1e-30
            where &= ~hits(m, [c * do], [m.half + c * err + m.slack * np.abs(c * do)])
        dj, err = self._delta(j), self._error(m, j)
        tol = m.half + coefficient * err + m.slack * np.abs(coefficient * dj)
        return excess(m, [coefficient * dj], [tol], where) if where.sum() >= LEAST_ENTRIES else 0.0

    def _explained(self, m: _Merge, parents: Sequence[int], coefficients: list[float]) -> tuple[float, float]:
        """The share of the merge's telling entries the parents explain beyond chance, and the share of them only
        their sums explain (none of them alone), by the better of two readings of the subsets' sums: each parent's
        coefficient the same in every subset (no ``normalize``, or DARE-linear's), or divided by the subset's weights
        (TIES' ``normalize``; the weights from the entries two parents kept)."""
        deltas, errors = [self._delta(j) for j in parents], [self._error(m, j) for j in parents]
        best = (-1.0, 0.0)
        normalised = self._weights(m, deltas, coefficients, errors)
        for weights in [None] + ([normalised] if normalised is not None else []):
            alone: tuple[list[np.ndarray], list[np.ndarray]] = ([], [])
            together: tuple[list[np.ndarray], list[np.ndarray]] = ([], [])
            for size in range(1, len(deltas) + 1):
                for subset in itertools.combinations(range(len(deltas)), size):
                    total = sum(weights[k] for k in subset) if weights is not None else 1.0
                    scale = [coefficients[k] * (weights[k] / total if weights is not None else 1.0) for k in subset]
                    parts = [a * deltas[k] for a, k in zip(scale, subset)]
                    errs = sum(abs(a) * errors[k] for a, k in zip(scale, subset))
                    into = alone if size == 1 else together
                    into[0].append(np.sum(parts, axis=0))
                    into[1].append(m.half + errs + m.slack * np.sum(np.abs(parts), axis=0))
            value = excess(m, alone[0] + together[0], alone[1] + together[1])
            rest = m.telling & ~hits(m, *alone)
            only = excess(m, *together, rest) * float(rest.sum()) / max(1, int(m.telling.sum()))
            best = max(best, (value, only))
        return best

    def _weights(
        self, m: _Merge, deltas: list[np.ndarray], coefficients: list[float], errors: list[np.ndarray]
    ) -> list[float] | None:
        """The parents' relative weights under TIES' ``normalize`` (the first's 1), each from the entries it and the
        first kept alone: there the merge is t a_1 d_1 + (1 - t) a_k d_k, t = w_1 / (w_1 + w_k), a spike in t."""
        weights = [1.0]
        first = coefficients[0] * deltas[0]
        for k in range(1, len(deltas)):
            other = coefficients[k] * deltas[k]
            apart = first - other
            tol = m.half + coefficients[0] * errors[0] + coefficients[k] * errors[k] + m.slack * np.abs(first)
            t = spike(m.delta - other, apart, tol, m, ratio=False)
            if t is None or not 0 < t < 1:
                return None
            weights.append(weights[0] * (1 - t) / t)
        return weights

    def _method(self, m: _Merge, parents: list[int], coefficients: list[float]) -> str:
        """``ties`` where each parent's entries absent from the merge (another parent's alone there, its sign the
        same: no election dropped it) are its smallest within their matrix's group, else ``dare``."""
        aucs = []
        for k, j in enumerate(parents):
            dj = self._delta(j)
            others = [p for p in parents if p != j]
            alone = np.zeros(len(dj), bool)
            for o, c in zip(others, (coefficients[parents.index(p)] for p in others)):
                tol = m.half + c * self._error(m, o) + m.slack * np.abs(c * self._delta(o))
                alone |= np.abs(m.delta - c * self._delta(o)) <= tol
            own = m.half + coefficients[k] * self._error(m, j)
            single = np.abs(m.delta - coefficients[k] * dj) <= own + m.slack * np.abs(coefficients[k] * dj)
            shows = m.telling & (np.abs(coefficients[k] * dj) >= TELLING * own)  # its share would show
            dropped = shows & alone & ~single & (np.sign(dj) == np.sign(m.delta))
            kept = shows & single
            if dropped.sum() >= 8 and kept.sum() >= 8:
                aucs.append(_auc(_in_group(np.abs(dj)), kept, dropped))
        return "ties" if aucs and float(np.mean(aucs)) >= TRIMMED_AUC else "dare"


def _screen(m: _Merge, deltas: np.ndarray, errors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row of ``deltas`` (a candidate's delta at ``m``'s entries; ``errors`` likewise) as a parent alone: the
    coefficient its ratios pile up on, its spike (in logarithms, within the median precision of its entries; 0: too few precise), and
    the share of ``m``'s telling entries it explains alone beyond chance."""
    k = len(deltas)
    d, tel = m.delta[None, :], m.telling[None, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        r = d / deltas
        width = (m.half + np.abs(r) * errors + m.slack * np.abs(d)) / np.abs(deltas)
        keep = tel & (deltas != 0) & (r > 0) & (width <= 0.1 * r)
        x = np.where(keep, np.log(np.where(keep, r, 1.0)), np.nan)
        w = np.where(keep, np.log1p(width / np.where(keep, r, 1.0)), np.nan)
    count = keep.sum(axis=1)
    enough = count >= 8
    if not enough.any():
        return np.zeros(k), np.zeros(k)
    row, q = np.arange(k), x.shape[1]
    half = np.maximum(np.sort(w, axis=1)[row, np.maximum(count - 1, 0) // 2], m.slack)  # NaN last: the median
    xs = np.sort(x, axis=1)
    filled = np.where(np.isnan(xs), 5e3, xs) + row[:, None] * 1e4  # one sorted array, each row apart from the next
    flat = filled.reshape(-1)
    lo = np.searchsorted(flat, (filled - half[:, None]).reshape(-1), side="left").reshape(k, q) - row[:, None] * q
    hi = np.searchsorted(flat, (filled + half[:, None]).reshape(-1), side="right").reshape(k, q) - row[:, None] * q
    at = np.argmax(np.where(np.isnan(xs), -1, hi - lo), axis=1)
    a, b = lo[row, at], hi[row, at]  # the peak's window, sorted: its median is its middle
    c = np.exp(0.5 * (xs[row, np.clip((a + b - 1) // 2, 0, q - 1)] + xs[row, np.clip((a + b) // 2, 0, q - 1)]))
    c = np.where(enough & np.isfinite(c), c, 0.0)[:, None]
    prediction, tolerance = c * deltas, m.half + c * errors + m.slack * np.abs(c * deltas)
    told = max(1, int(m.telling.sum()))
    share = lambda f: ((np.abs(d - f * prediction) <= tolerance) & tel).sum(axis=1) / told
    chance = np.mean([share(1 + b * m.band) for b in BANDS], axis=0)
    return c[:, 0], np.where(enough, share(1.0) - chance, 0.0)


def hits(m: _Merge, predictions: Sequence[np.ndarray], tolerances: Sequence[np.ndarray]) -> np.ndarray:
    """Which of ``m``'s entries some prediction matches within its tolerance."""
    hit = np.zeros(len(m.delta), bool)
    for p, t in zip(predictions, tolerances):
        hit |= np.abs(m.delta - p) <= t
    return hit


def excess(
    m: _Merge, predictions: Sequence[np.ndarray], tolerances: Sequence[np.ndarray], where: np.ndarray | None = None
) -> float:
    """The share of ``m``'s telling entries (``where``: those of them) some prediction matches within its tolerance,
    less the mean share the same predictions scaled by :data:`BANDS` steps of ``m``'s band match: chance, which
    an entry too coarse to tell one coefficient from a nearby one (a delta of a few units of bf16) matches alike."""
    telling = m.telling if where is None else where
    delta = m.delta[telling]
    parts = [(p[telling], np.broadcast_to(t, m.delta.shape)[telling]) for p, t in zip(predictions, tolerances)]

    def share(factor: float) -> float:
        hit = np.zeros(len(delta), bool)
        for p, t in parts:
            hit |= np.abs(delta - factor * p) <= t
        return float(hit.mean()) if len(hit) else 0.0

    return share(1.0) - float(np.mean([share(1 + b * m.band) for b in BANDS]))


def spike(
    numerator: np.ndarray, denominator: np.ndarray, tolerance: np.ndarray, m: _Merge, *, ratio: bool = True
) -> float | None:
    """The value most of ``numerator / denominator`` pile up on, over ``m``'s telling entries where it is precise
    (positive ratios, in logarithms, for a coefficient; ``ratio=False``: a share in (0, 1)); None where too few."""
    ok = m.telling & (denominator != 0)
    r = numerator[ok] / denominator[ok]
    width = np.abs(tolerance[ok] / denominator[ok])
    if ratio:
        keep = (r > 0) & (width <= 0.1 * np.abs(r) + 1e-300)
    else:  # a share strictly between the two parents' own (those entries one of them kept alone)
        keep = (r > 2 * width) & (r < 1 - 2 * width) & (width <= 0.1)
    if int(keep.sum()) < 8:
        return None
    r, width = r[keep], width[keep]
    x = np.log(r) if ratio else r
    w = np.log1p(width / r) if ratio else width
    half = max(float(np.median(w)), m.slack if ratio else 1e-6)
    order = np.sort(x)
    counts = np.searchsorted(order, order + half, side="right") - np.searchsorted(order, order - half, side="left")
    at = int(np.argmax(counts))
    near = order[np.abs(order - order[at]) <= half]
    centre = float(np.median(near))
    return float(np.exp(centre)) if ratio else centre


def ulp(values: np.ndarray, bits: int) -> np.ndarray:
    """The spacing of a ``bits``-bit significand's numbers at each of ``values`` (0 at 0)."""
    _, exponent = np.frexp(np.asarray(values, np.float64))
    return np.where(values != 0, np.ldexp(1.0, exponent - bits), 0.0)


def _bits_of(values: np.ndarray) -> int:
    """The coarsest float type every one of ``values`` is exact in: the base's stored precision."""
    v = values.astype(np.float32)
    if not len(v) or not np.array_equal(v.astype(np.float64), values):
        return 53
    if not (v.view(np.uint32) & 0xFFFF).any():
        return BITS["bfloat16"]
    with np.errstate(over="ignore"):
        return BITS["float16"] if np.array_equal(v.astype(np.float16).astype(np.float32), v) else BITS["float32"]


def _in_group(values: np.ndarray) -> np.ndarray:
    """Each value against the median of its :data:`GROUP` (one matrix's consecutive entries)."""
    n = len(values) - len(values) % GROUP
    out = np.ones(len(values))
    if n:
        groups = values[:n].reshape(-1, GROUP)
        out[:n] = (groups / np.maximum(np.median(groups, axis=1, keepdims=True), 1e-300)).reshape(-1)
    return out


def _auc(values: np.ndarray, high: np.ndarray, low: np.ndarray) -> float:
    """The chance that a value of ``high`` exceeds one of ``low`` (ties half): Mann-Whitney's statistic."""
    from scipy.stats import rankdata

    a, b = values[high], values[low]
    ranks = rankdata(np.concatenate([a, b]))
    return float((ranks[: len(a)].sum() - len(a) * (len(a) + 1) / 2) / (len(a) * len(b)))
