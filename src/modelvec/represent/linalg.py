"""The linear algebra of the representation, batched over matrices of one shape (torch)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from .representation import Representation

#: The precision of a delta as it is formed (float32 subtraction of the stored dtypes' exact upcasts).
DELTA_EPS = float(torch.finfo(torch.float32).eps)


#: Float64 bytes of a delta converted at a time by the randomized solver on the CPU (stays in cache).
CHUNK_BYTES = 4 << 20


class Float64Products:
    """dW @ X and dW^T @ Y in float64 for a (b, n, m) batch of deltas held in float32.

    The deltas are converted a chunk at a time, along the side they are stored contiguously (rows, or the
    columns of nn.Linear's transposed view), so the solver's float64 costs ``chunk_bytes`` of memory, not a
    float64 copy of the batch (``chunk_bytes`` None: the whole batch at once, as on a GPU).
    """

    def __init__(self, delta: torch.Tensor, chunk_bytes: int | None = CHUNK_BYTES) -> None:
        self.delta = delta
        n, m = delta.shape[-2:]
        self.by_rows = delta.stride(-1) == 1 or m == 1  # else the columns are the contiguous side
        side, other = (n, m) if self.by_rows else (m, n)
        batch = delta.numel() // max(1, n * m)
        self.step = side if chunk_bytes is None else max(1, chunk_bytes // (8 * other * max(1, batch)))
        self.side = side
        self._whole: torch.Tensor | None = None

    def _chunks(self) -> Iterator[tuple[int, int, torch.Tensor]]:
        """(start, stop, the chunk in float64): converted into one reused buffer laid out as the deltas are."""
        if self.step >= self.side:  # the whole batch, converted once
            if self._whole is None:
                self._whole = self.delta.double()
            yield 0, self.side, self._whole
            return
        lead, (n, m) = self.delta.shape[:-2], self.delta.shape[-2:]
        dtype, device = torch.float64, self.delta.device
        if self.by_rows:
            scratch = torch.empty((*lead, self.step, m), dtype=dtype, device=device)
        else:
            scratch = torch.empty((*lead, self.step, n), dtype=dtype, device=device).mT
        for i in range(0, self.side, self.step):
            j = min(self.side, i + self.step)
            if self.by_rows:
                part = scratch[..., : j - i, :]
                part.copy_(self.delta[..., i:j, :])
            else:
                part = scratch[..., :, : j - i]
                part.copy_(self.delta[..., :, i:j])
            yield i, j, part

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """dW @ x, x float64 (..., m, w)."""
        if self.by_rows:
            return torch.cat([part @ x for _, _, part in self._chunks()], dim=-2)
        return self._summed(lambda i, j, part: part @ x[..., i:j, :])

    def rmatmul(self, y: torch.Tensor) -> torch.Tensor:
        """dW^T @ y, y float64 (..., n, w)."""
        if self.by_rows:
            return self._summed(lambda i, j, part: part.mT @ y[..., i:j, :])
        return torch.cat([part.mT @ y for _, _, part in self._chunks()], dim=-2)

    def _summed(self, term: Callable[[int, int, torch.Tensor], torch.Tensor]) -> torch.Tensor:
        total: torch.Tensor | None = None
        for i, j, part in self._chunks():
            value = term(i, j, part)
            total = value if total is None else total.add_(value)
        assert total is not None
        return total


def truncated_svd(
    delta: torch.Tensor,
    rank: int,
    solver: str = "randomized",
    *,
    n_iter: int = 4,
    n_oversamples: int = 8,
    seed: int = 0,
    chunk_bytes: int | None = CHUNK_BYTES,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The top-``rank`` left singular vectors and values of each matrix of a (b, n, m) batch, in float64.

    Returns U (b, n, k) and S (b, k), k = min(rank, n, m), singular values in decreasing order.
    ``randomized`` is the randomized block Krylov method (Musco & Musco, 2015): a seeded Gaussian
    block of ``rank + n_oversamples`` columns, ``n_iter`` applications of dW dW^T whose blocks are all
    kept, then Rayleigh-Ritz. Fine-tuning deltas have flat spectra (sigma_8 / sigma_1 ~ 0.4-0.7 on
    the demo zoo), where it is far more accurate than subspace iteration for the same matrix
    products. Matrices too small to gain from it get the exact SVD.

    Every step is float64 (the products through :class:`Float64Products`, so a float32 batch is never
    copied whole): singular vectors of close singular values move by the rounding times sigma / gap, and
    float32 rounding, which differs between BLAS and LAPACK libraries, moved U by 1e-4 between a CPU and
    a GPU; in float64 the same solver gives the same U to float32 rounding on both.
    """
    n, m = delta.shape[-2:]
    k = min(rank, n, m)
    width = min(k + n_oversamples, n, m)
    if solver == "exact" or width * (n_iter + 1) >= min(n, m):  # small matrices: exact is cheaper
        u, s, _ = torch.linalg.svd(delta.double(), full_matrices=False)
        return u[..., :k], s[..., :k]
    products = Float64Products(delta, chunk_bytes)
    generator = torch.Generator(device="cpu").manual_seed(seed)
    # drawn in float32 and upcast: the seed's Omega of the float32 solver this one replaced
    omega = torch.randn(m, width, generator=generator).to(delta.device, torch.float64)
    y = products.matmul(omega)
    blocks = []
    for _ in range(n_iter):
        y, _ = torch.linalg.qr(y)
        blocks.append(y)
        y = products.matmul(products.rmatmul(y))
    blocks.append(y)
    q, _ = torch.linalg.qr(torch.cat(blocks, dim=-1) if len(blocks) > 1 else y)
    # Rayleigh-Ritz on the Krylov basis: B = Q^T dW is small (c x m); its left singular vectors are
    # the eigenvectors of B B^T (c x c).
    b_t = products.rmatmul(q)  # B^T
    evals, evecs = torch.linalg.eigh(b_t.mT @ b_t)
    evals, evecs = evals.flip(-1)[..., :k], evecs.flip(-1)[..., :k]
    return q @ evecs, evals.clamp_min(0).sqrt()


def low_rank_svd(left: torch.Tensor, right: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The top-``rank`` left singular vectors and values of left @ right^T, never forming the product.

    For a delta known as thin factors (a LoRA adapter: n x r and m x r, r small): QR of each
    factor, then the SVD of the small R_left R_right^T; U = Q_left U_small. Exact, in
    O((n + m) r^2) instead of the O(n m r) of a solver on the n x m matrix. Returns U (..., n, k)
    and S (..., k), k = min(rank, n, m, r), singular values in decreasing order.
    """
    q_left, r_left = torch.linalg.qr(left)
    _q_right, r_right = torch.linalg.qr(right)
    u, s, _ = torch.linalg.svd(r_left @ r_right.mT, full_matrices=False)
    k = min(rank, s.shape[-1])
    return q_left @ u[..., :k], s[..., :k]


def canonical_signs(u: torch.Tensor) -> torch.Tensor:
    """Flip each column (singular vector) so that its largest-magnitude entry is positive."""
    idx = u.abs().argmax(dim=-2, keepdim=True)
    signs = torch.sign(torch.gather(u, -2, idx))
    signs[signs == 0] = 1
    return u * signs


def factor_blocks(
    u: torch.Tensor, s: torch.Tensor, representation: Representation, m: int, eps: float = DELTA_EPS
) -> torch.Tensor:
    """(b, block_size): each (n x m) matrix's kept factor, zero-padded to ``rank`` columns, column by column.

    ``S`` keeps the singular values alone (b, rank). A column whose singular value is below
    max(n, m) * ``eps`` * sigma_1 is zeros: ``eps`` is the precision of the deltas (float32), not of
    the solver's arithmetic, so a float64 solver does not keep the float32 rounding noise of a
    low-rank delta as directions.
    """
    b, n, k = u.shape
    tol = s[..., :1] * eps * max(n, m)
    live = s > tol
    if representation.factor == "S":
        return torch.nn.functional.pad(s * live, (0, representation.rank - k))
    if representation.sign == "max-abs":
        u = canonical_signs(u)
    u = u * live.unsqueeze(-2)
    if representation.factor == "US":
        u = u * (s * live).unsqueeze(-2)
    if k < representation.rank:
        u = torch.nn.functional.pad(u, (0, representation.rank - k))
    return u.mT.reshape(b, -1)


def sketch_matrix(m: int, rank: int, seed: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The Gaussian test matrix of the sketch dW @ Omega: fixed by (m, rank, seed), shared by all models.

    Scaled by 1/sqrt(rank) so that sketches preserve norms in expectation (Johnson-Lindenstrauss).
    """
    generator = torch.Generator(device="cpu").manual_seed(seed)
    return (torch.randn(m, rank, generator=generator) / rank**0.5).to(device)


def normalise_blocks(blocks: torch.Tensor) -> torch.Tensor:
    """Each row scaled to unit norm (a zero row stays zero), so large blocks do not drown small ones."""
    norms = blocks.norm(dim=-1, keepdim=True)
    return torch.where(norms > 0, blocks / norms.clamp_min(torch.finfo(blocks.dtype).tiny), blocks)
