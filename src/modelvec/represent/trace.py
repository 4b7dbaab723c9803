"""A model's trace: what the tree of a base's derivatives is inferred from, taken from the rows the vector reads.

The vector's blocks are normalised, so a delta's size is gone from it, and its mean over layers mixes them. The
trace keeps what the tree needs (:mod:`modelvec.analyse.tree`):

- ``sketch``: one more CountSketch, into :data:`TRACE_FLOATS` buckets (64 KB a model), of every block's raw sketch (before its
  norm), so of the rows read of the whole delta W_model - W_base. Linear in the weights: a merge's trace is its
  parents' weighted sum, an adapter on a fine-tune's is the fine-tune's plus its own, and the distance between
  two traces estimates the distance between the two models' weights (a Johnson-Lindenstrauss embedding).
- ``scale``: the size of the base's weights in the same map, against which a delta is small (a derivative) or as
  large as the weights themselves (unrelated weights with the base's shapes: about sqrt(2) times).
- ``levels``: how many distinct values the model's stored rows hold (the first rows read of each matrix, each
  row counted on its own), against the base's same rows rounded to the model's precision: about 1 for a trained
  model (a fine-tune's or random weights', in fp32 or bf16), far below for a quantization's round trip (at most
  255 values a row at 8 bits, 16 a group at 4: a row of 384 holds at most 255 or 96), where rows are longer than
  255 values, as every real model's are.
  None for an adapter (its factors are not weights).
- ``zeros``: the share of those rows' entries the model left as the base's (equal in the model's own precision):
  a few percent for a trained model, a quarter and more for a TIES or DARE merge, which trims or drops entries of
  each parent's delta (mergekit's ``density``), far more than any of its parents left; ``zeros_bf16``, the same
  with both rounded to bf16 (what a merge published in bf16 is compared with: a short fp32 delta rounds to the
  base's value in bf16), and ``precision``, the model's stored dtype.
- ``rounding``: how large rounding to the model's own precision is against the weights, sqrt(sum ulp(w)^2 / 12 /
  sum w^2) on the base's same rows: the residual that a merge saved in that precision leaves of its parents' sum
  (bf16: about 0.16 % of the weights, a short fine-tune's whole delta; float32: nothing).
- ``along``: the component of the delta along the base's own weights on those rows, <W_base, dW> / |W_base|^2,
  exact in float64. Linear in the weights, so a linear merge's is its parents' weighted sum; a spherical
  interpolation (SLERP) keeps the weights' norm, which a linear one does not: it adds (1/cos(theta/2) - 1) times
  the base's weights, a positive excess over the weighted sum.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # the store reads traces without torch: the map and the counts import it when made
    import torch

#: Buckets of a trace's sketch: an inner product within |a| |b| / 128 of the weights' (1/sqrt(16384)). A 4-bit round
#: trip's rounding is ~20x a short fine-tune's delta; its parent is found where this error on the rounding's cross
#: terms stays below the delta's own size (docs/tree.md: 4,096 buckets were too few on the selection half).
TRACE_FLOATS = 16384
#: Stored rows of each matrix whose values are counted for ``levels``.
LEVEL_ROWS = 16

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


def row_stats(rows: torch.Tensor, base: torch.Tensor) -> RowStats:
    """A model's first stored rows of one matrix beside the base's same rows (as stored, any float dtypes): their
    :class:`RowStats`. Everything is counted in the model's own precision: the base's distinct values rounded to
    it (a bf16 merge of an fp32 base is not a quantization), an entry the base's where it equals the base's
    rounded to it."""
    import torch

    distinct, count = distinct_values(rows)
    rounded = base.to(rows.dtype)
    base_distinct = distinct_values(rounded)[0] if rows.shape == base.shape else 0
    same = int((rows == rounded).sum()) if rows.shape == base.shape else 0
    same_bf16 = int((rows.to(torch.bfloat16) == base.to(torch.bfloat16)).sum()) if rows.shape == base.shape else 0
    b, w = base.double(), rows.double()
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
    )


def ulp_of(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of ``dtype``'s numbers at each of ``values`` (float64): what rounding to it moves a value by, at
    most twice over."""
    import torch

    _, exponent = torch.frexp(values)
    return torch.finfo(dtype).eps * torch.pow(2.0, exponent.double() - 1) * (values != 0)
