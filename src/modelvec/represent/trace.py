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
  row counted on its own), against the base's same rows: about 1 for a trained model (a fine-tune's or random
  weights'), far below for a quantization's round trip (at most 255 values a row at 8 bits, 16 a group at 4:
  a row of 384 holds at most 255 or 96), where rows are longer than 255 values, as every real model's are.
  None for an adapter (its factors are not weights).
- ``zeros``: the share of those rows' entries the model left as the base's (equal in the model's own precision):
  a few percent for a trained model, a quarter and more for a TIES or DARE merge, which trims or drops entries of
  each parent's delta (mergekit's ``density``), far more than any of its parents left.
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


@dataclass(frozen=True)
class RowStats:
    """What the first stored rows read of each matrix say of a model beside the base's same rows, summed over the
    matrices: distinct values (and rows counted), entries equal to the base's (and entries counted), and the sums of
    W_base . dW and W_base . W_base."""

    distinct: int = 0
    rows: int = 0
    same: int = 0
    entries: int = 0
    along: float = 0.0
    base: float = 0.0

    def __add__(self, other: RowStats) -> RowStats:
        return RowStats(
            distinct=self.distinct + other.distinct,
            rows=self.rows + other.rows,
            same=self.same + other.same,
            entries=self.entries + other.entries,
            along=self.along + other.along,
            base=self.base + other.base,
        )

    def trace(self, sketch: np.ndarray, scale: float, base_levels: int) -> Trace:
        """The trace of a model with these row statistics (``base_levels``: the base's own distinct values)."""
        return Trace(
            sketch,
            self.distinct / base_levels if base_levels else None,
            scale,
            self.same / self.entries if self.entries else None,
            self.along / self.base if self.base else None,
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
    :class:`RowStats`. An entry is the base's where it equals the base's rounded to the model's precision."""
    distinct, count = distinct_values(rows)
    same = int((rows == base.to(rows.dtype)).sum()) if rows.shape == base.shape else 0
    b, w = base.double(), rows.double()
    return RowStats(distinct, count, same, rows.numel(), float((b * (w - b)).sum()), float((b * b).sum()))
