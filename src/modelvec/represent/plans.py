"""Which rows of each stored matrix a representation reads, and what its projection contracts.

A share of rows (``Representation.rows``) is chosen once, from the seed and the matrix's place
(stack, layer, family), in contiguous blocks of stored rows: the same rows for every model and the
base, so a fine-tune's rows are compared with the same rows of its base, and reading them is a few
byte ranges (a range request on the Hub, a few pages of a mapped file). Blocks hold between a page
and 1 MiB of bf16 values, spread over up to ``MIN_BLOCKS`` places of the matrix (see
:func:`select_rows`).

Everything here follows from the stored shapes and the parameters alone (no weights), so the
rows a model needs are known before any of its bytes are fetched. Rows are *stored* rows:
``nn.Linear`` stores W^T (out x in), so its rows are output features, the axis the sketch
contracts; GPT-2's ``Conv1D`` stores W (in x out), so its rows are input features and the sketch
keeps them. Fused tensors: Phi-3's ``qkv_proj`` and ``gate_up_proj`` (``nn.Linear``) split
along the rows, so each part chooses its own rows as an unfused matrix of its family and size
would (a fused and an unfused checkpoint of the same weights read the same rows); GPT-2's
``c_attn`` (``Conv1D``) splits along the columns, so its parts share one choice of rows, made
for the whole tensor.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, replace

import numpy as np

from ..read import MatrixRef, Orientation
from .representation import Representation

#: Values per contiguous block of rows at most (1 MiB of bf16) and at least (a 4 KiB page of bf16) where the share
#: has that many: small enough that even a small matrix's share is spread over several places of it (its
#: geometry then follows the whole's; one contiguous run of output features does not).
READ_BLOCK_ELEMS = 1 << 19
MIN_READ_ELEMS = 1 << 11
#: Between those sizes, a share is spread over at least this many blocks.
MIN_BLOCKS = 8
#: A number of rows (a row budget) is spread over this many blocks: the budget's rows are few (64 of an 8B model's
#: 4,096-14,336), and each block is a range request, whose cost on the Hub is its round trip and both ends' CPU
#: (8 blocks of 8 rows: requests of ~90 kB at 8B, half the time of a stream at 1 Gbit/s; 4 of 16: ~180 kB).
COUNT_BLOCKS = 4


def derived_seed(seed: int, *place: object) -> int:
    """A seed for one matrix's randomness, from the representation's seed and the matrix's place
    (stable across runs and machines: a hash, not Python's salted ``hash``)."""
    text = "/".join(map(str, (seed, *place))).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") >> 1


def select_rows(
    n_rows: int, row_elems: int, share: float | int, seed: int, place: tuple
) -> tuple[tuple[int, int], ...]:
    """Row ranges [start, stop) of a matrix of ``n_rows`` stored rows of ``row_elems`` values each.

    ``share``: a share of the rows (a float) or a number of them (an int: a row budget,
    :meth:`~modelvec.represent.representation.Representation.row_budget`). All rows when the share is 1 or the
    number at least ``n_rows``. Otherwise ceil(share * n_rows) rows (or the number), in blocks of equal size: as
    many as ``MIN_BLOCKS`` (for a number, ``COUNT_BLOCKS``) where each still holds ``MIN_READ_ELEMS`` values, fewer
    where the share is smaller (a share under that size is one block), never more than ``READ_BLOCK_ELEMS`` values
    each. The blocks are cells of
    a grid of that size over the rows, drawn without replacement from a generator seeded by ``seed`` and
    ``place`` (adjacent cells merged into one range).
    """
    want = share if isinstance(share, int) else max(1, math.ceil(share * n_rows))
    if want >= n_rows or n_rows <= 1:
        return ((0, n_rows),)
    row_elems = max(row_elems, 1)
    least, most = math.ceil(MIN_READ_ELEMS / row_elems), max(1, READ_BLOCK_ELEMS // row_elems)
    spread = COUNT_BLOCKS if isinstance(share, int) else MIN_BLOCKS
    block = min(want, max(least, min(most, want // spread)))
    count = math.ceil(want / block)
    block = math.ceil(want / count)  # the share split evenly over the blocks
    cells = n_rows // block
    rng = np.random.default_rng(derived_seed(seed, "rows", *place))
    chosen = np.sort(rng.choice(cells, size=min(count, cells), replace=False))
    ranges: list[list[int]] = []
    for cell in chosen.tolist():
        start, stop = cell * block, (cell + 1) * block
        if ranges and ranges[-1][1] == start:
            ranges[-1][1] = stop
        else:
            ranges.append([start, stop])
    return tuple((a, b) for a, b in ranges)


@dataclass(frozen=True, kw_only=True)
class MatrixPlan:
    """What one matrix of the representation reads of its stored tensor, and the shape of its block.

    ``row_ranges``: stored row ranges of the tensor (absolute, so a fused part's are offset into it);
    ``row_start``: the part's first stored row (a row's local index is ``row - row_start``);
    ``n_rows``: rows of the part; ``cols``: the stored column span read; ``contract_rows``: the
    sketch contracts the stored rows (``nn.Linear``: W's output side) or the columns (``Conv1D``).
    """

    tensor: str
    row_ranges: tuple[tuple[int, int], ...]
    row_start: int
    n_rows: int
    cols: tuple[int, int]
    contract_rows: bool
    #: the block's floats where the vector's size budget shrinks it (None: rank x kept; see :func:`within_size`)
    floats: int | None = None

    @property
    def n_selected(self) -> int:
        return sum(b - a for a, b in self.row_ranges)

    @property
    def n_cols(self) -> int:
        return self.cols[1] - self.cols[0]

    @property
    def kept(self) -> int:
        """The side of the matrix the sketch keeps (the block has rank x kept floats)."""
        return self.n_cols if self.contract_rows else self.n_selected

    def local_rows(self) -> np.ndarray:
        """The part-local indices of the selected rows, in reading order."""
        return np.concatenate([np.arange(a, b) for a, b in self.row_ranges]) - self.row_start


def plan_matrix(
    ref: MatrixRef,
    stored_shape: tuple[int, int],
    representation: Representation,
    prefix: str = "",
    share: float | int | None = None,
) -> MatrixPlan:
    """The rows and columns of its stored tensor that ``ref``'s block needs under ``representation``, reading
    ``share`` of its rows (a float) or that many of them (an int; default: ``representation.rows``, which must then
    be a number).

    ``stored_shape`` is the whole stored tensor's (fused parts included); a fused part whose
    parts do not divide it is left whole here (the reader refuses it with its own message).
    """
    n_stored, n_cols = stored_shape
    linear = ref.orientation is Orientation.LINEAR
    span = ref.span(n_stored if linear else n_cols) if ref.n_parts > 1 else None
    part = span or (0, n_stored if linear else n_cols)
    if linear:  # rows are this part's own (split along the rows): chosen as an unfused matrix's would be
        row_start, n_rows, cols = part[0], part[1] - part[0], (0, n_cols)
        place: tuple = (ref.stack, ref.layer, ref.family)
    else:  # rows are shared by the parts (split along the columns): chosen once for the tensor
        row_start, n_rows, cols = 0, n_stored, part
        place = (ref.stack, ref.layer, ref.fused or ref.family)
    if share is None:
        if not isinstance(representation.rows, float):
            raise ValueError("rows='auto' needs the matrices' size: pass share=representation.row_budget(values)")
        share = representation.rows
    local = select_rows(n_rows, n_cols, share, representation.seed, place)
    rows = tuple((row_start + a, row_start + b) for a, b in local)
    return MatrixPlan(
        tensor=prefix + ref.tensor, row_ranges=rows, row_start=row_start, n_rows=n_rows, cols=cols, contract_rows=linear
    )


def byte_share(plans: list[MatrixPlan], stored_shapes: dict[str, tuple[int, int]]) -> float:
    """The share of the matrices' stored values the plans read (each tensor's rows counted once)."""
    read: dict[str, set[tuple[int, int]]] = {}
    for plan in plans:
        read.setdefault(plan.tensor, set()).update(plan.row_ranges)
    total = sum(r * c for r, c in (stored_shapes[t] for t in read))
    got = sum(sum(b - a for a, b in ranges) * stored_shapes[t][1] for t, ranges in read.items())
    return got / total if total else 0.0


def within_size(
    plans: dict[tuple[str, int, str], MatrixPlan], representation: Representation, vocab: int = 0
) -> tuple[dict[tuple[str, int, str], MatrixPlan], int]:
    """The plans with their blocks shrunk so that a vector holds at most ``representation.size`` floats, and the
    head's floats (``vocab`` wide, 0: no head).

    Every block, the head's too, keeps the same share of its floats (the largest that fits): the vector's shape
    is today's default's, scaled. A block's floats are its CountSketch's buckets, so each block stays an unbiased
    sketch of its matrix (inner products exact in expectation, their variance growing as buckets shrink). Layers
    pooled by their mean keep one size per family. Nothing changes where the vector fits, or ``size`` is none.
    """
    budget = representation.size_limit
    if budget is None:
        return plans, vocab
    sizes = {key: representation.block_size(p.kept) for key, p in plans.items()}
    counted = {}  # one layer per stack when pooled by the mean: its blocks are the vector's
    for (stack, layer, family), size in sizes.items():
        if representation.pooling == "concat" or (stack, family) not in counted:
            counted[(stack, family) if representation.pooling == "mean" else (stack, layer, family)] = size
    total = sum(counted.values()) + vocab
    if total <= budget:
        return plans, vocab
    share = budget / total
    out = {key: replace(p, floats=max(1, int(sizes[key] * share))) for key, p in plans.items()}
    return out, max(1, int(vocab * share)) if vocab else 0
