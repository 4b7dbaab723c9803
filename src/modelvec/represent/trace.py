"""A model's trace: what the tree of a base's derivatives is inferred from (:mod:`modelvec.analyse.tree.lineage`), taken
from the rows the vector reads; what each part tells: docs/tree.md.

- ``sketch``: a CountSketch into :data:`TRACE_FLOATS` buckets (64 KB a model) of every block's raw sketch (before
  its norm), so of the rows read of W_model - W_base: linear in the weights (a merge's trace is its parents'
  weighted sum, an adapter on a fine-tune's the fine-tune's plus its own); the distance between two traces
  estimates the distance between the two models' weights (a Johnson-Lindenstrauss embedding).
- ``scale``: the base's weights' size in the same map (unrelated weights with its shapes: about sqrt(2) times it).

On the first :data:`LEVEL_ROWS` stored rows read of each matrix, beside the base's same rows:

- ``levels``: distinct values a row, against the base's rounded to the model's precision: about 1 for trained
  weights, far below for a quantization's round trip (at most 255 a row at 8 bits); None for an adapter.
- ``zeros``: the share of entries left as the base's in the model's own precision (``zeros_bf16``: both rounded
  to bf16), a quarter and more for a TIES or DARE merge; ``precision``: the model's stored dtype.
- ``rounding``: sqrt(sum ulp(w)^2 / 12 / sum w^2) on the base's rows, ulp in the model's precision: what a merge
  saved in it leaves of its parents' sum (bf16: about 0.16 % of the weights; float32: nothing).
- ``along``: <W_base, dW> / |W_base|^2, exact in float64: linear, so a linear merge's is its parents' weighted sum,
  and SLERP (which keeps the weights' norm) adds a positive excess.
- ``entries``: the delta's own values at fixed entries (groups of
  :data:`~modelvec.analyse.tree.entries.GROUP` consecutive ones of each matrix, at least :data:`ENTRIES` in all), and
  ``base_entries`` the base's weights there: a TIES or DARE merge is fitted on them entry by entry
  (:mod:`modelvec.analyse.tree.entries`). None for an adapter.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..analyse.tree.entries import GROUP

if TYPE_CHECKING:  # the store reads traces without torch: the map and the counts import it when made
    import torch

#: Buckets of a trace's sketch: an inner product within |a| |b| / 128 of the weights' (1/sqrt(16384)). A 4-bit round
#: trip's rounding is ~20x a short fine-tune's delta; its parent is found where this error on the rounding's cross
#: terms stays below the delta's own size (docs/tree.md: 4,096 buckets were too few on the selection half).
TRACE_FLOATS = 16384
#: Stored rows of each matrix whose values are counted for ``levels``.
LEVEL_ROWS = 16
#: Raw delta entries a trace keeps at least, in groups of :data:`~modelvec.analyse.tree.entries.GROUP` from each matrix
#: (as many groups from each): 16 KB a model with the base's (SmolLM2-135M's 210 matrices: 3,360 entries).
ENTRIES = 2048

Key = tuple[str, int, str]


@dataclass(frozen=True)
class Trace:
    """What one model adds to the tree's evidence: its delta's sketch (float64), its levels, zeros and along (None:
    an adapter), and ``scale``, the norm of the base's own weights' sketch (the same map): the size an unrelated
    model's delta has."""

    sketch: np.ndarray
    levels: float | None = None
    scale: float = 0.0
    zeros: float | None = None
    along: float | None = None
    zeros_bf16: float | None = None
    precision: str | None = None
    rounding: float | None = None
    entries: np.ndarray | None = None  # the delta at the kept entries (float32)
    base_entries: np.ndarray | None = None  # the base's weights there


_NONE = np.zeros(0, np.float32)


@dataclass(frozen=True)
class RowStats:
    """What the first stored rows read of each matrix say of a model beside the base's same rows, summed over the
    matrices: distinct values (and rows counted), entries equal to the base's (and entries counted), and the sums of
    W_base . dW and W_base . W_base."""

    distinct: int = 0
    rows: int = 0
    base_distinct: int = 0  # the base's same rows', rounded to the model's precision
    same: int = 0
    same_bf16: int = 0  # entries equal to the base's with both rounded to bf16
    entries: int = 0
    along: float = 0.0
    base: float = 0.0
    ulps: float = 0.0  # sum of ulp(w)^2 / 12 over the base's same rows, ulp in the model's precision
    precision: str | None = None  # the model's stored dtype (its first matrix's)
    kept: np.ndarray | None = field(default_factory=lambda: _NONE)  # the delta at the kept entries, matrix after
    kept_base: np.ndarray = field(default_factory=lambda: _NONE)  # matrix (None: one lacks them); the base's there

    def __add__(self, other: RowStats) -> RowStats:
        return RowStats(
            distinct=self.distinct + other.distinct,
            rows=self.rows + other.rows,
            base_distinct=self.base_distinct + other.base_distinct,
            same=self.same + other.same,
            same_bf16=self.same_bf16 + other.same_bf16,
            entries=self.entries + other.entries,
            along=self.along + other.along,
            base=self.base + other.base,
            ulps=self.ulps + other.ulps,
            precision=self.precision or other.precision,
            kept=None if self.kept is None or other.kept is None else np.concatenate([self.kept, other.kept]),
            kept_base=np.concatenate([self.kept_base, other.kept_base]),
        )

    def trace(self, sketch: np.ndarray, scale: float) -> Trace:
        """The trace of a model with these row statistics."""
        return Trace(
            sketch,
            self.distinct / self.base_distinct if self.base_distinct else None,
            scale,
            self.same / self.entries if self.entries else None,
            self.along / self.base if self.base else None,
            self.same_bf16 / self.entries if self.entries else None,
            self.precision,
            (self.ulps / self.base) ** 0.5 if self.base else None,
            self.kept if self.kept is not None and len(self.kept) else None,
            self.kept_base if self.kept is not None and len(self.kept) else None,
        )


class Tracer:
    """The fixed map of raw blocks to a trace's sketch: each block's entries hashed, with a random sign, into
    :data:`TRACE_FLOATS` buckets, the hash fixed by ``seed`` and the block's place (the same for every model)."""

    def __init__(self, sizes: Mapping[Key, int], seed: int) -> None:
        import torch

        #: buckets: TRACE_FLOATS, or the raw blocks' floats where they are fewer (more would add no precision)
        self.floats = min(TRACE_FLOATS, sum(sizes.values()))
        self.tables: dict[Key, tuple[torch.Tensor, torch.Tensor]] = {}
        for key, size in sizes.items():
            gen = torch.Generator().manual_seed(zlib.crc32(repr((seed, "trace", *key)).encode()))
            where = torch.randint(0, self.floats, (size,), generator=gen)
            sign = (torch.randint(0, 2, (size,), generator=gen) * 2 - 1).double()
            self.tables[key] = (where, sign)

    def sketch(self, raw: Mapping[Key, torch.Tensor]) -> np.ndarray:
        """The trace's sketch of the raw blocks given (a block not given is a zero delta)."""
        import torch

        out = torch.zeros(self.floats, dtype=torch.float64)
        for key, block in raw.items():
            where, sign = self.tables[key]
            out.index_add_(0, where, block.reshape(-1).to("cpu", torch.float64) * sign)
        return out.numpy()


def distinct_values(rows: torch.Tensor) -> tuple[int, int]:
    """(distinct values summed over the rows, each row counted on its own; rows counted)."""
    if rows.shape[0] == 0 or rows.shape[1] == 0:
        return 0, 0
    ordered = rows.sort(dim=1).values
    changes = (ordered[:, 1:] != ordered[:, :-1]).sum()
    return int(changes) + rows.shape[0], rows.shape[0]


def row_stats(rows: torch.Tensor, base: torch.Tensor, entries: np.ndarray | None = None) -> RowStats:
    """A model's first stored rows of one matrix beside the base's same rows (as stored, any float dtypes): their
    :class:`RowStats`. Everything is counted in the model's own precision: the base's distinct values rounded to
    it (a bf16 merge of an fp32 base is not a quantization), an entry the base's where it equals the base's
    rounded to it. ``entries``: the flat positions in those rows whose delta is kept (:func:`entry_positions`)."""
    import torch

    distinct, count = distinct_values(rows)
    rounded = base.to(rows.dtype)
    base_distinct = distinct_values(rounded)[0] if rows.shape == base.shape else 0
    same = int((rows == rounded).sum()) if rows.shape == base.shape else 0
    same_bf16 = int((rows.to(torch.bfloat16) == base.to(torch.bfloat16)).sum()) if rows.shape == base.shape else 0
    b, w = base.double(), rows.double()
    kept: np.ndarray | None = _NONE
    at_base = _NONE
    if entries is not None:
        at = torch.from_numpy(entries)
        if rows.shape == base.shape and rows.numel() > int(entries.max(initial=0)):
            kept = (w.reshape(-1)[at] - b.reshape(-1)[at]).float().numpy()
            at_base = b.reshape(-1)[at].float().numpy()
        else:
            kept, at_base = None, np.full(len(entries), np.nan, np.float32)
    return RowStats(
        distinct=distinct,
        rows=count,
        base_distinct=base_distinct,
        same=same,
        same_bf16=same_bf16,
        entries=rows.numel(),
        along=float((b * (w - b)).sum()),
        base=float((b * b).sum()),
        ulps=float((ulp_of(b, rows.dtype) ** 2).sum() / 12),
        precision=str(rows.dtype).removeprefix("torch."),
        kept=kept,
        kept_base=at_base,
    )


def entry_positions(shapes: Mapping[Key, tuple[int, int]], seed: int) -> dict[Key, np.ndarray]:
    """The entries of each matrix's first stored rows read (``shapes``: those rows' shape) whose delta a trace keeps:
    as many groups of :data:`~modelvec.analyse.tree.entries.GROUP` consecutive ones from each matrix as make at least
    :data:`ENTRIES` in all, at places fixed by ``seed`` and the matrix (the same for every model)."""
    groups = max(1, -(-ENTRIES // (GROUP * max(1, len(shapes)))))
    out = {}
    for key, (n, m) in shapes.items():
        slots = max(1, (n * m) // GROUP)
        rng = np.random.default_rng(zlib.crc32(repr((seed, "entries", *key)).encode()))
        starts = rng.choice(slots, groups, replace=slots < groups) * GROUP
        out[key] = np.minimum((starts[:, None] + np.arange(GROUP)).reshape(-1), max(0, n * m - 1)).astype(np.int64)
    return out


def ulp_of(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of ``dtype``'s numbers at each of ``values`` (float64): what rounding to it moves a value by, at
    most twice over."""
    import torch

    _, exponent = torch.frexp(values)
    return torch.finfo(dtype).eps * torch.pow(2.0, exponent.double() - 1) * (values != 0)
