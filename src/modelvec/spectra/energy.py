"""The energy rank: the smallest r whose top r squared singular values carry a threshold of a matrix's energy.

The ranks need only the squared singular values σᵢ², which are the eigenvalues of the Gram matrix of
the smaller side (WᵀW or WWᵀ), and the total energy Σσᵢ², the squared Frobenius norm. Both are
computed in float64 from the matrix's exact float64 upcast: a float64 Gram matrix (numpy's ``a.T @ a``,
which BLAS computes as ``syrk``, half the work of a product) and its eigenvalues (``numpy.linalg.eigvalsh``,
LAPACK ``syevd``). Every rank then equals that of a float64 SVD, where a float32 SVD (the usual
``svdvals`` loop) moves ranks whose threshold falls near a boundary. On the CPU the matrices of a
batch are spread over threads, one LAPACK call each: numpy releases the GIL around BLAS and LAPACK,
while scipy's ``linalg`` wrappers hold it, so with those the threads ran one at a time.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from ..core.settings import setting, validate

if TYPE_CHECKING:
    import torch

T = TypeVar("T")
R = TypeVar("R")
DEFAULT_THRESHOLDS = (0.5, 0.9, 0.99)
_REACHED = 1e-9  # a threshold counts as reached within this relative margin (see modelvec.studies.depth)


@dataclass(frozen=True)
class Ranks:
    """Which energy ranks ``rank`` computes, each setting declared once (the CLI's options are made from them)."""

    of: str = setting(
        "weights", "Study the weights W, or the delta W - W_base (needs --base).", choices=("weights", "delta")
    )
    thresholds: tuple[float, ...] = setting(
        DEFAULT_THRESHOLDS,
        "Energy thresholds, repeated or comma-separated: --threshold 0.5,0.9,0.99.",
        kind=float,
        many=True,
        above=0,
        maximum=1,
        flag="--threshold",
        metavar="SHARES",
    )

    def __post_init__(self) -> None:
        validate(self)


def energy_rank(singular_values: np.ndarray, threshold: float) -> int:
    """Smallest r with sum_{i<=r} s_i^2 >= threshold * sum s_i^2; 0 for a zero matrix."""
    return rank_of_energies(np.asarray(singular_values, dtype=np.float64) ** 2, threshold)


def rank_of_energies(energies: np.ndarray, threshold: float) -> int:
    """Smallest r with sum_{i<=r} e_i >= threshold * sum e_i, for energies e_i = σᵢ² in descending order."""
    if not 0 < threshold <= 1:
        raise ValueError(f"threshold must be in (0, 1], not {threshold}")
    energy = np.asarray(energies, dtype=np.float64)
    total = energy.sum()
    if total == 0:
        return 0
    cumulative = np.cumsum(energy) / total
    return int(np.searchsorted(cumulative, threshold * (1 - _REACHED), side="left") + 1)


def _gram_eigenvalues(w: np.ndarray) -> np.ndarray:
    """σᵢ² of one float64 (n, m) matrix, descending, from the Gram matrix of its smaller side."""
    gram = w.T @ w if w.shape[1] <= w.shape[0] else w @ w.T  # numpy calls syrk for a product with its transpose
    return _eigenvalues(gram)


def _eigenvalues(gram: np.ndarray) -> np.ndarray:
    return np.clip(np.linalg.eigvalsh(gram)[::-1], 0.0, None)


def fuses_by_gram(shapes: Sequence[tuple[int, int]]) -> bool:
    """Whether column blocks of these shapes, side by side, let their Grams sum to the whole's.

    For W = [W_1 ... W_k] (blocks of n rows), W Wᵀ = Σ W_p W_pᵀ: when every block is at least as
    wide as tall, each W_p W_pᵀ is the Gram of that block's smaller side, needed for its own spectrum,
    and the fused matrix's Gram costs k - 1 additions instead of a product (GPT-2's ``c_attn``,
    Phi-3's ``gate_up_proj``).
    """
    return len(shapes) > 1 and len({n for n, _ in shapes}) == 1 and all(m >= n for n, m in shapes)


def as_float64(w: torch.Tensor) -> np.ndarray:
    """The exact float64 upcast of a CPU float tensor (float32, float16, bfloat16 or float64) as a C-ordered array.

    Converted by numpy, not torch: numpy puts large arrays on huge pages, torch's fresh allocations
    fault page by page, and with BLAS work between conversions that made torch's ``.to(float64)``
    12x slower here (0.50 s against 0.04 s over bert-base's 72 matrices).
    """
    import torch

    w = w.detach().cpu()
    if w.dtype == torch.bfloat16:  # numpy has no bfloat16: its bits are the top half of a float32's
        bits = w.contiguous().view(torch.int16).numpy().view(np.uint16)
        return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return w.numpy().astype(np.float64, order="C")


def _threads() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def gram_energies(batch: Sequence[torch.Tensor] | torch.Tensor, device: str | torch.device = "cpu") -> np.ndarray:
    """σᵢ² (float64, descending) of each matrix of a batch of one shape (b, n, m), as a (b, min(n, m)) array.

    On the CPU each matrix is one BLAS + LAPACK call on its own thread. On a GPU the batch is one
    batched float64 product and ``eigvalsh``. Non-finite input gives NaN rows.
    """
    import torch

    device = torch.device(device)
    if device.type != "cpu":
        a = torch.stack(list(batch)).to(device).double()
        gram = a.mT @ a if a.shape[-1] <= a.shape[-2] else a @ a.mT
        try:
            values = torch.linalg.eigvalsh(gram).flip(-1).clamp_min(0)
        except torch.linalg.LinAlgError:
            values = torch.full(gram.shape[:-1], float("nan"), dtype=torch.float64)
        return values.cpu().numpy()

    def one(w: torch.Tensor) -> np.ndarray:
        a = as_float64(w)
        if not np.isfinite(a).all():
            return np.full(min(a.shape), np.nan)
        return _gram_eigenvalues(a)

    return np.stack(each_on_a_thread(one, list(batch)))


def block_energies(blocks: Sequence[np.ndarray], whole: bool = False) -> list[np.ndarray]:
    """σᵢ² (descending) of each float64 matrix of ``blocks`` and, with ``whole``, last, of the blocks side by side.

    With ``whole`` the blocks are the parts of one fused matrix W = [W_1 ... W_k], with ``fuses_by_gram``
    true of their shapes: W's energies come from the sum of the parts' Grams (see there). Any non-finite
    value gives NaN rows, for the caller to name the tensor.
    """
    if not all(np.isfinite(w).all() for w in blocks):
        rows = [min(w.shape) for w in blocks] + ([blocks[0].shape[0]] if whole else [])
        return [np.full(n, np.nan) for n in rows]
    if not whole:
        return [_gram_eigenvalues(w) for w in blocks]
    total, out = None, []
    for w in blocks:
        gram = w @ w.T  # (n, n): this block's smaller side
        out.append(_eigenvalues(gram))
        total = gram if total is None else np.add(total, gram, out=total)
    assert total is not None
    return [*out, _eigenvalues(total)]


def fused_gram_energies(groups: Sequence[Sequence[torch.Tensor]]) -> list[list[np.ndarray]]:
    """σᵢ² of each column block of each group and, last, of the blocks side by side, on the CPU
    (:func:`block_energies`), one group per thread."""
    return each_on_a_thread(lambda parts: block_energies([as_float64(w) for w in parts], whole=True), list(groups))


def each_on_a_thread(one: Callable[[T], R], items: list[T]) -> list[R]:
    """``one`` of each item, the items spread over threads with one BLAS thread each (numpy releases
    the GIL in BLAS and LAPACK; a small eigenproblem does not split well over cores, separate ones do)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1), ThreadPoolExecutor(min(_threads(), max(1, len(items)))) as pool:
        return list(pool.map(one, items))
