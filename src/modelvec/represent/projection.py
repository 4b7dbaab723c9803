"""The sketch's projections: one matrix's selected entries (rows as stored) mapped to its block.

Every projection is linear in the matrix, fixed by the seed and the matrix's place, and the same
for every model, so a fine-tune's block minus its base's block is the block of its delta, and
blocks of different models live in one space. A block has ``rank x kept`` floats
(:attr:`~modelvec.represent.plans.MatrixPlan.kept`), whatever the projection:

- ``shared`` and ``gaussian``: (dW_sel Omega)^T with Omega Gaussian, scaled by 1/sqrt(rank),
  contracting W's output side (``nn.Linear``'s stored rows, ``Conv1D``'s stored columns).
  ``shared`` draws one Omega per width for every layer (the default until the evidence showed that
  a mean over layers then mixes layers: their cross terms enter every inner product);
  ``gaussian`` draws one per layer and matrix, so those terms have expectation zero.
- ``countsketch``: every selected entry (i, j) is added, times a random sign s_r(i) s_c(j), to the
  bucket (h_r(i) + h_c(j)) mod D, with random row and column tables: pairwise-independent hashing
  of the whole block, an unbiased Johnson-Lindenstrauss embedding of vec(dW_sel) whose variance
  does not depend on dW's rank (a one-sided sketch of a rank-8 adapter sees 8 directions).

Computed in float64 (the base's block is subtracted from the fine-tune's: see docs/scale.md).
"""

from __future__ import annotations

from typing import Any

import torch

from .linalg import sketch_matrix
from .plans import MatrixPlan, derived_seed
from .representation import Representation


class _Linear:
    """A projection whose blocks are final as they come (linear throughout): ``raw_size`` is the block's floats and
    :meth:`final` is the identity; :class:`TopProjection`'s are not."""

    size: int
    device: torch.device
    _local: torch.Tensor  # the plan's selected rows among the part's (MatrixPlan.local_rows)

    @property
    def raw_size(self) -> int:
        """Floats of a block before :meth:`final`."""
        return self.size

    def selected(self, p: torch.Tensor) -> torch.Tensor:
        """The rows of a factor P (the part's rows x k) the plan selects, float64 on the device."""
        return p.to(self.device, torch.float64)[self._local]

    def final(self, block: torch.Tensor) -> torch.Tensor:
        return block


class Projection(_Linear):
    """The fixed random map of one matrix (its :class:`MatrixPlan`) to its block, on ``device``.

    Use: ``acc = p.start()``; ``p.add(acc, chunk, first)`` for consecutive chunks of the selected
    rows (float64, ``first`` the position of the chunk's first row in the selection); then
    ``p.finish(acc)``, the block as a flat float64 tensor. :meth:`of_factors` gives the block of a
    low-rank delta from its factors.
    """

    def __init__(
        self,
        plan: MatrixPlan,
        representation: Representation,
        place: tuple,
        device: torch.device,
        shared: dict[int, torch.Tensor] | None = None,
    ) -> None:
        """``place`` (stack, layer, family) seeds the per-matrix randomness; ``shared`` caches the
        ``shared`` projection's Omega^T per width across matrices."""
        self.plan = plan
        self.rank = representation.rank
        self.kind = representation.projection
        self.device = device
        self.size = representation.plan_floats(plan)  # rank x kept, or what the vector's size budget leaves
        self._local = torch.from_numpy(plan.local_rows()).to(device)
        if self.kind == "countsketch":
            gen = torch.Generator().manual_seed(derived_seed(representation.seed, "countsketch", *place))
            size = self.size
            self.h_row = torch.randint(0, size, (plan.n_rows,), generator=gen)[plan.local_rows()].to(device)
            self.h_col = torch.randint(0, size, (plan.n_cols,), generator=gen).to(device)
            self.s_row = (torch.randint(0, 2, (plan.n_rows,), generator=gen) * 2 - 1).double()[plan.local_rows()]
            self.s_row = self.s_row.to(device)
            self.s_col = (torch.randint(0, 2, (plan.n_cols,), generator=gen) * 2 - 1).double().to(device)
        else:
            m = plan.n_rows if plan.contract_rows else plan.n_cols
            if self.kind == "shared" and shared is not None and m in shared:
                omega_t = shared[m]
            else:
                seed = (
                    representation.seed
                    if self.kind == "shared"
                    else derived_seed(representation.seed, "gaussian", *place)
                )
                omega_t = sketch_matrix(m, representation.rank, seed).mT.contiguous().double().to(device)
                if self.kind == "shared" and shared is not None:
                    shared[m] = omega_t
            if plan.contract_rows and plan.n_selected < plan.n_rows:  # only the selected rows' part is used
                omega_t = omega_t[:, self._local].contiguous()
            self.omega_t = omega_t

    def start(self) -> torch.Tensor:
        if self.kind == "countsketch":
            return torch.zeros(2 * self.size, dtype=torch.float64, device=self.device)
        kept = self.plan.n_cols if self.plan.contract_rows else self.plan.n_selected
        return torch.zeros(self.rank, kept, dtype=torch.float64, device=self.device)

    def add(self, acc: torch.Tensor, chunk: torch.Tensor, first: int) -> None:
        """Add a chunk of selected rows (k x n_cols, float64), the ``first``-th to the (first+k)-th of the selection."""
        stop = first + chunk.shape[0]
        if self.kind == "countsketch":  # buckets h_r + h_c < 2 D: folded at the end, no modulo per entry
            chunk.mul_(self.s_col).mul_(self.s_row[first:stop, None])
            index = self.h_row[first:stop, None] + self.h_col[None, :]
            acc.index_add_(0, index.reshape(-1), chunk.reshape(-1))
        elif self.plan.contract_rows:
            acc.addmm_(self.omega_t[:, first:stop], chunk)
        else:
            acc[:, first:stop] = self.omega_t @ chunk.T

    def finish(self, acc: torch.Tensor) -> torch.Tensor:
        return acc[: self.size] + acc[self.size :] if self.kind == "countsketch" else acc.reshape(-1)

    def of_factors(self, p: torch.Tensor, q: torch.Tensor, chunk_rows: int) -> torch.Tensor:
        """The block of the delta P Q^T in stored coordinates (P: the part's rows x k, Q: columns x k)."""
        p_sel = self.selected(p)
        q = q.to(self.device, torch.float64)
        if self.kind == "countsketch":
            acc = self.start()
            for first in range(0, p_sel.shape[0], chunk_rows):
                self.add(acc, p_sel[first : first + chunk_rows] @ q.T, first)
            return self.finish(acc)
        if self.plan.contract_rows:
            return ((self.omega_t @ p_sel) @ q.T).reshape(-1)
        return ((self.omega_t @ q) @ p_sel.T).reshape(-1)


class ProbeProjection(_Linear):
    """The block of one matrix's delta taken through the base's inputs to it: a CountSketch of dW·H (``probe``).

    ``inputs`` (tokens x width, the matrix's input side) holds the base's inputs to the matrix on the probe
    (:mod:`~modelvec.represent.probe`). ``nn.Linear`` stores dW^T (out x in): each selected stored row (an output
    feature) times H^T is that feature's change on every probe token, k x T for k rows, sketched as it comes.
    ``Conv1D`` stores dW (in x out): its selected rows are input features, so the product H_sel dW_sel (T x out)
    sums over them, accumulated and sketched at the end (with every row read, the layer's whole change). Either
    way the entry for (feature, token) goes to bucket (h(feature) + h(token)) mod D with sign s(feature) s(token),
    the same tables for every model: linear in dW, so a fine-tune's block minus its base's is its delta's. The
    block has the plan's floats, as the weights' sketch has.
    """

    def __init__(
        self, plan: MatrixPlan, representation: Representation, place: tuple, device: torch.device, inputs: Any
    ) -> None:
        self.plan = plan
        self.device = device
        self.size = representation.plan_floats(plan)
        h = torch.as_tensor(inputs).to(device, torch.float64)  # tokens x width (shared where already so)
        self.tokens = int(h.shape[0])
        local = torch.from_numpy(plan.local_rows())
        self._local = local.to(device)
        gen = torch.Generator().manual_seed(derived_seed(representation.seed, "probe", *place))
        features = plan.n_rows if plan.contract_rows else plan.n_cols  # the output side: Linear's rows, Conv1D's cols
        h_feat = torch.randint(0, self.size, (features,), generator=gen)
        s_feat = (torch.randint(0, 2, (features,), generator=gen) * 2 - 1).double()
        self.h_tok = torch.randint(0, self.size, (self.tokens,), generator=gen).to(device)
        self.s_tok = (torch.randint(0, 2, (self.tokens,), generator=gen) * 2 - 1).double().to(device)
        if plan.contract_rows:  # Linear: stored rows are outputs, the input side is the stored columns (all read)
            self.h_out = h_feat[local].to(device)
            self.s_out = s_feat[local].to(device)
            self.h_t = h.mT.contiguous()  # width x tokens
        else:  # Conv1D: stored rows are inputs (the selected ones), the outputs the part's columns
            self.h_out, self.s_out = h_feat.to(device), s_feat.to(device)
            self.h_sel = h[:, self._local].contiguous()  # tokens x selected rows

    def sketch_outputs(self, y: torch.Tensor, h_out: torch.Tensor, s_out: torch.Tensor, acc: torch.Tensor) -> None:
        """Add a change of outputs ``y`` (features x tokens, float64) to the buckets ``acc`` (2 D)."""
        y = y * s_out[:, None] * self.s_tok[None, :]
        acc.index_add_(0, (h_out[:, None] + self.h_tok[None, :]).reshape(-1), y.reshape(-1))

    def start(self) -> torch.Tensor:
        if self.plan.contract_rows:
            return torch.zeros(2 * self.size, dtype=torch.float64, device=self.device)
        return torch.zeros(self.tokens, self.plan.n_cols, dtype=torch.float64, device=self.device)

    def add(self, acc: torch.Tensor, chunk: torch.Tensor, first: int) -> None:
        """Add a chunk of selected stored rows (k x n_cols, float64), the ``first``-th on of the selection."""
        stop = first + chunk.shape[0]
        if self.plan.contract_rows:
            self.sketch_outputs(chunk @ self.h_t, self.h_out[first:stop], self.s_out[first:stop], acc)
        else:
            acc.addmm_(self.h_sel[:, first:stop], chunk)

    def finish(self, acc: torch.Tensor) -> torch.Tensor:
        if not self.plan.contract_rows:
            buckets = torch.zeros(2 * self.size, dtype=torch.float64, device=self.device)
            self.sketch_outputs(acc.mT, self.h_out, self.s_out, buckets)
            acc = buckets
        return acc[: self.size] + acc[self.size :]

    def of_factors(self, p: torch.Tensor, q: torch.Tensor, chunk_rows: int) -> torch.Tensor:
        """The block of the delta P Q^T in stored coordinates (P: the part's rows x k, Q: columns x k)."""
        p_sel = self.selected(p)
        q = q.to(self.device, torch.float64)
        if self.plan.contract_rows:  # (P_sel Q^T) H^T = P_sel (H Q)^T
            acc = self.start()
            hq = (q.mT @ self.h_t).contiguous()  # k x tokens
            for first in range(0, p_sel.shape[0], chunk_rows):
                stop = first + chunk_rows
                self.sketch_outputs(p_sel[first:stop] @ hq, self.h_out[first:stop], self.s_out[first:stop], acc)
            return self.finish(acc)
        return self.finish((self.h_sel @ p_sel) @ q.mT)


class TopProjection:
    """The block of one matrix's delta kept at its top ``delta_rank`` singular directions (``delta_rank``), then
    sketched as :class:`ProbeProjection` sketches: the part of a full fine-tune's delta that an adapter of that rank
    could express, its drift in the other directions dropped; an adapter of at most that rank is kept whole.

    What is truncated is the delta's change of outputs on fixed inputs, Y = dW·H^T (features x T): the base's own
    inputs where the representation takes the probe, else a seeded Gaussian H (``rank`` rows, a randomized range
    finder of dW). Until :meth:`final`, a block is Y itself, linear in dW: a fine-tune's Y minus its base's is its
    delta's, and an adapter's on a parent is the sum of both. :meth:`final` truncates Y by its SVD and CountSketches
    it into the plan's floats.
    """

    def __init__(
        self, plan: MatrixPlan, representation: Representation, place: tuple, device: torch.device, inputs: Any
    ) -> None:
        """``inputs``: the probe's H (tokens x the input side's width); None: a Gaussian one seeded by ``place``."""
        if inputs is None:
            width = plan.n_cols if plan.contract_rows else plan.n_rows
            seed = derived_seed(representation.seed, "delta-rank", *place)
            inputs = sketch_matrix(width, representation.rank, seed).mT.contiguous()
        self.sketch = ProbeProjection(plan, representation, place, device, inputs)
        self.plan, self.device, self.top = plan, device, int(representation.delta_rank)
        self.size = self.sketch.size
        tokens = self.sketch.tokens
        self.shape = (plan.n_selected, tokens) if plan.contract_rows else (tokens, plan.n_cols)

    @property
    def raw_size(self) -> int:
        """Floats of a block before :meth:`final`: Y, features x tokens."""
        return self.shape[0] * self.shape[1]

    def start(self) -> torch.Tensor:
        return torch.zeros(self.shape, dtype=torch.float64, device=self.device)

    def add(self, acc: torch.Tensor, chunk: torch.Tensor, first: int) -> None:
        """Add a chunk of selected stored rows (k x n_cols, float64), the ``first``-th on of the selection."""
        stop = first + chunk.shape[0]
        if self.plan.contract_rows:  # Linear: each stored row is an output feature, its change on every token
            acc[first:stop] = chunk @ self.sketch.h_t
        else:  # Conv1D: stored rows are inputs, summed over
            acc.addmm_(self.sketch.h_sel[:, first:stop], chunk)

    def finish(self, acc: torch.Tensor) -> torch.Tensor:
        return acc.reshape(-1)

    def of_factors(self, p: torch.Tensor, q: torch.Tensor, chunk_rows: int) -> torch.Tensor:
        """Y of the delta P Q^T in stored coordinates (P: the part's rows x k, Q: columns x k)."""
        p_sel = self.sketch.selected(p)
        q = q.to(self.device, torch.float64)
        if self.plan.contract_rows:
            return (p_sel @ (q.mT @ self.sketch.h_t)).reshape(-1)
        return ((self.sketch.h_sel @ p_sel) @ q.mT).reshape(-1)

    def final(self, block: torch.Tensor) -> torch.Tensor:
        """The block as the vector holds it: Y at its top singular directions, CountSketched (float64)."""
        y = block.reshape(self.shape).to(self.device)
        if min(self.shape) > self.top:
            u, s, vh = torch.linalg.svd(y, full_matrices=False)
            y = (u[:, : self.top] * s[: self.top]) @ vh[: self.top]
        features = y if self.plan.contract_rows else y.mT  # features x tokens
        buckets = torch.zeros(2 * self.size, dtype=torch.float64, device=self.device)
        self.sketch.sketch_outputs(features, self.sketch.h_out, self.sketch.s_out, buckets)
        return (buckets[: self.size] + buckets[self.size :]).cpu()


#: Every matrix's map to its block (one per representation: :meth:`Sketching._projections`).
AnyProjection = Projection | ProbeProjection | TopProjection
