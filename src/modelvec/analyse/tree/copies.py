"""Copies among one base's models: identical weights, and re-saves in another dtype, each with the model it copies.

Mirrors, re-uploads of the base, the same fine-tune in float16, bfloat16 or float32: a copy is never a parent, never
a point on the map, never counted in a score. From each model's trace (:mod:`modelvec.represent.trace`, linear):

- **identical weights**: the same trace bit for bit (the same checksum); a zero trace is the base's own weights;
- **a re-save in a coarser dtype** (float32 -> bfloat16, float16): its trace differs from its original's by the
  rounding alone, ``|T_m - T_j| <= rule.rounding * rounding_m * scale``, where ``rounding_m`` is the expected size of
  rounding to ``m``'s dtype against the weights (kept with the trace) and ``scale`` the base's weights' size in the
  same map. Only a model stored coarser than the other can be its re-save (among one dtype a re-save is exact), and
  only of a model whose own delta is clearly beyond that rounding (``rule.rounding`` times it again), or whose
  card names it: near the base, nearness alone tells nothing (a short fine-tune's re-save is as near its
  siblings). A re-save of the base is exact where it can be checked: every entry read is the base's rounded to its
  dtype (``same``, at least ``rule.resaved``), which a fine-tune whose delta is as small as the rounding is not.

Candidates are found without comparing every pair: a re-save's trace norm is within the same distance of its
original's (the triangle inequality), so only models of a finer dtype in that window of norms are considered, and of
those only the ones whose ``mini`` (a CountSketch of the trace into :data:`MINI` buckets, kept with it: distances
within about 10 %) is within twice that distance have their traces compared.

Among identical or rounding-equal models (a connected group), the **original** is, in order: the base, where it is
among them; the one the others' cards name; the one created first (the Hub's date, or a local model's files'); the
one in the higher precision; and only where nothing tells them apart, the first by name. Each copy says which rule
chose its original (``chosen_by``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .rule import TreeRule

#: Significand bits of each float type (a precision's fineness).
BITS = {"float64": 53, "float32": 24, "float16": 11, "bfloat16": 8}

#: Buckets of a trace's mini sketch: the candidates' filter (a distance within about sqrt(2 / MINI) of the trace's).
MINI = 64

#: Why a model was chosen as the original of its copies.
BY_BASE = "the base"
BY_CARD = "named by their cards"
BY_DATE = "created first"
BY_PRECISION = "in the higher precision"
BY_NAME = "nothing else tells them apart: the first by name"


#: For the models of a group: the models each one's card names, and when each was made.
About = Callable[[list[str]], tuple[Mapping[str, Sequence[str]], Mapping[str, str]]]


@dataclass(frozen=True)
class Copy:
    """A model that copies another (``original``: a model's name, or the base's): ``exact`` for identical weights,
    else equal up to rounding to its own ``precision`` (a re-save); ``chosen_by``: why ``original`` is the original."""

    model: str
    original: str
    exact: bool
    precision: str | None
    chosen_by: str

    def describe(self, base: str) -> str:
        """A few words: "a copy of X (identical weights)", "a bfloat16 re-save of the base"."""
        what = "the base" if self.original == base else self.original
        if self.exact:
            return f"a copy of {what} (identical weights)"
        return f"a {self.precision or 'rounded'} re-save of {what} (equal up to rounding)"


@dataclass(frozen=True)
class Traced:
    """What the copies are found from, one entry per model: the trace's checksum (None: no trace; then the vector's
    stands for it), whether the model's weights are the base's (a zero vector or trace), the trace's norm, the
    model's dtype and its rounding (None: not kept), the share of its entries read that equal the base's rounded to its
    dtype (None: not kept), and whether it can be a re-save at all (an adapter, a GGUF quantization cannot: its dtype
    says nothing of its values)."""

    models: Sequence[str]
    digest: Sequence[str | None]
    zero: Sequence[bool]
    norm: Sequence[float | None]
    precision: Sequence[str | None]
    rounding: Sequence[float | None]
    same: Sequence[float | None]
    resaved: Sequence[bool]
    scale: float
    mini: Sequence[np.ndarray | None] | None = None  # each trace's :func:`mini_of` (None: not kept: compared whole)


def find_copies(
    traced: Traced,
    distance: Callable[[list[tuple[int, int]]], np.ndarray],
    *,
    base: str,
    rule: TreeRule,
    about: About | None = None,
) -> dict[str, Copy]:
    """Every copy among ``traced.models`` with its original (see the module docstring). ``distance``: the trace
    distances of pairs of positions (only candidates are asked); ``rule``: how many times the expected rounding a
    re-save may differ by (``rounding``) and how many of its entries a re-save of the base keeps as the base's
    (``resaved``); ``about``: for the models of a group, what their cards name (the stored models, or ``base``) and
    when each was made (ISO dates, comparable as text): asked of groups alone."""
    n = len(traced.models)
    groups = _Groups(n + 1)  # position n: the base
    exact = _exact_edges(traced, groups, n)
    for i, j in _rounding_edges(traced, distance, rule, about):
        groups.join(i, j)
    out: dict[str, Copy] = {}
    groups_of = [g for g in groups.components() if len(g) > 1]
    names = [traced.models[k] for g in groups_of for k in g if k != n]
    named, created = about(names) if about is not None and names else ({}, {})  # asked once, of every group
    for members in groups_of:
        root, why = _original(sorted(members), traced, n, named, created)
        for k in members:
            if k in (root, n):
                continue
            same = exact.get(k) is not None and exact.get(k) == exact.get(root)
            original = base if root == n else traced.models[root]
            out[traced.models[k]] = Copy(traced.models[k], original, same, traced.precision[k], why)
    return out


def _exact_edges(traced: Traced, groups: _Groups, n: int) -> dict[int, object]:
    """Join identical traces (the base's: zero); each model's key of identity (n: the base's weights)."""
    first: dict[str, int] = {}
    key: dict[int, object] = {n: n}
    for i, (digest, zero) in enumerate(zip(traced.digest, traced.zero)):
        if zero:
            groups.join(i, n)
            key[i] = n
        elif digest is not None:
            groups.join(i, first.setdefault(digest, i))
            key[i] = digest
    return key


def _rounding_edges(
    traced: Traced, distance: Callable[[list[tuple[int, int]]], np.ndarray], rule: TreeRule, about: About | None
) -> list[tuple[int, int]]:
    """The pairs (model, original or n: the base) whose traces differ by no more than the model's rounding; where
    the original's own delta is itself within that rounding of the base, only where the model's card names it."""
    n, factor = len(traced.models), rule.rounding
    allowed = [
        factor * r * traced.scale if r and ok and traced.norm[i] is not None and not traced.zero[i] else 0.0
        for i, (r, ok) in enumerate(zip(traced.rounding, traced.resaved))
    ]
    norm = [float(v) if v is not None else 0.0 for v in traced.norm]
    edges = [(i, n) for i in range(n) if allowed[i] and norm[i] <= allowed[i] and (traced.same[i] or 0) >= rule.resaved]
    finer = sorted(
        (norm[j], j)
        for j in range(n)
        if traced.norm[j] is not None and not traced.zero[j] and BITS.get(traced.precision[j] or "", 0)
    )
    norms, order = np.array([v for v, _ in finer]), np.array([j for _, j in finer], dtype=np.int64)
    bits = np.array([BITS.get(p or "", 0) for p in traced.precision])
    minis = _minis(traced)
    pairs: list[tuple[int, int]] = []
    at = np.array(norm) if n else np.zeros(0)
    los, his = np.searchsorted(norms, at - allowed), np.searchsorted(norms, at + np.array(allowed), "right")
    for i in (i for i in range(n) if allowed[i] and bits[i] and his[i] > los[i]):
        window = order[los[i] : his[i]]
        near = window[bits[window] > bits[i]]
        if minis is not None and len(near) and not np.isnan(minis[i]).any():  # a mini further than twice: none
            near = near[~(np.linalg.norm(minis[near] - minis[i], axis=1) > 2 * allowed[i])]  # NaN: not kept, kept
        pairs += [(i, int(j)) for j in near]
    close = [(i, j) for (i, j), d in zip(pairs, distance(pairs) if pairs else []) if d <= allowed[i]]
    told = [(i, j) for i, j in close if norm[j] >= factor * allowed[i]]  # the original clearly beyond the rounding
    near = [(i, j) for i, j in close if norm[j] < factor * allowed[i]]
    if near and about is not None:  # an original as near the base as the rounding: nearness alone tells nothing
        named, _ = about(sorted({traced.models[i] for i, _ in near}))
        told += [(i, j) for i, j in near if traced.models[j] in named.get(traced.models[i], ())]
    return edges + told


def mini_of(sketch: np.ndarray) -> np.ndarray:
    """A trace's sketch hashed, with random signs fixed by its length, into :data:`MINI` buckets (float32): linear,
    so two minis' distance estimates their traces' within about sqrt(2 / MINI)."""
    v = np.asarray(sketch, np.float64).reshape(-1)
    bucket, sign = _mini_map(len(v))
    return np.bincount(bucket, weights=v * sign, minlength=MINI).astype(np.float32)


@functools.lru_cache(maxsize=8)
def _mini_map(length: int) -> tuple[np.ndarray, np.ndarray]:
    """Each entry's bucket and sign, fixed by the sketch's length (one map for every trace of a base)."""
    rng = np.random.default_rng(length)
    return rng.integers(0, MINI, length), rng.choice([-1.0, 1.0], length)


def _minis(traced: Traced) -> np.ndarray | None:
    """Every trace's mini as rows (NaN where one is not kept: such a model is compared whole), None where none is."""
    if traced.mini is None or all(m is None for m in traced.mini):
        return None
    out = np.full((len(traced.models), MINI), np.nan)
    for i, m in enumerate(traced.mini):
        if m is not None and len(m) == MINI:
            out[i] = m
    return out


def _original(
    members: list[int], traced: Traced, n: int, named: Mapping[str, Sequence[str]], created: Mapping[str, str]
) -> tuple[int, str]:
    """The original of a group of identical or rounding-equal models, and the rule that chose it."""
    if n in members:
        return n, BY_BASE
    names = {traced.models[k]: k for k in members}
    cited = {names[p] for k in members for p in named.get(traced.models[k], ()) if p in names and names[p] != k}
    if cited:
        roots = [k for k in cited if not any(p in names and names[p] in cited for p in named.get(traced.models[k], ()))]
        pool = roots or sorted(cited)
        if len(pool) == 1:
            return pool[0], BY_CARD
        members = pool
    dates = [created.get(traced.models[k]) for k in members]
    if all(dates):
        first = min(dates)  # type: ignore[type-var]
        if dates.count(first) == 1:
            return members[dates.index(first)], BY_DATE
        members = [k for k, d in zip(members, dates) if d == first]
    bits = [BITS.get(traced.precision[k] or "", 0) for k in members]
    if bits.count(max(bits)) == 1:
        return members[bits.index(max(bits))], BY_PRECISION
    members = [k for k, b in zip(members, bits) if b == max(bits)]
    return min(members, key=lambda k: traced.models[k]), BY_NAME


class _Groups:
    """Union-find over positions."""

    def __init__(self, n: int) -> None:
        self.up = list(range(n))

    def find(self, i: int) -> int:
        while self.up[i] != i:
            self.up[i] = self.up[self.up[i]]
            i = self.up[i]
        return i

    def join(self, i: int, j: int) -> None:
        self.up[self.find(i)] = self.find(j)

    def components(self) -> list[list[int]]:
        out: dict[int, list[int]] = {}
        for i in range(len(self.up)):
            out.setdefault(self.find(i), []).append(i)
        return list(out.values())
