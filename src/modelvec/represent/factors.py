"""The SVD factors of a model's deltas: formed per layer or per family across layers, batched, factored in float64."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ..core.errors import CheckpointError, IncompatibleError
from ..read import Checkpoint, Layout, MatrixRef, Orientation, check_compatible
from .linalg import CHUNK_BYTES, factor_blocks, low_rank_svd, normalise_blocks, truncated_svd
from .state import EmbedderParts

_FAMILY_BATCH_BYTES = 1 << 30  # float32 deltas per batched family product: bounded whatever the depth


class Factoring(EmbedderParts):
    """The SVD factors' part of a vector: each delta formed from both files (per layer on the CPU, per family across
    layers on a GPU), batched by shape and factored; an adapter's from its thin factors, never the full delta."""

    def _delta_vector(self, ck: Checkpoint) -> np.ndarray:
        """The SVD factors' part of the vector: every block but the head's."""
        if ck.factored:  # a LoRA adapter: its delta comes as thin factors
            factors = self._adapter_factors(ck)
            return self._pooled(self.layout_, lambda refs: [factors[r.key] for r in refs])
        layout = ck.layout()
        check_compatible(ck, layout, self.layout_)
        if self.by_family:
            by_key = self._family_factors(ck, layout)
            return self._pooled(layout, lambda refs: [by_key[r.key] for r in refs])
        return self._pooled(layout, lambda refs: self._layer_factors(ck, layout, refs))

    def _adapter_factors(self, ck: Checkpoint) -> dict[tuple[str, int, str], torch.Tensor]:
        """Every matrix's SVD factor from an adapter's dW = L R^T (n x r, m x r), never forming the n x m delta.

        The factors come from :func:`low_rank_svd` (exact, whatever ``solver`` says), in float64 and then through
        the same :func:`factor_blocks` (signs, zero columns beyond the adapter's rank) as dense deltas. A matrix
        the adapter leaves alone has dW = 0: its block is zeros, as a merged model's would be.
        """
        p = self.representation
        shapes = dict(self.shapes_)
        deltas = ck.low_rank_deltas(self.layout_, shapes)
        factors: dict[tuple[str, int, str], torch.Tensor] = {}
        for ref in self.layout_.refs:
            delta = deltas.get(ref.key)
            if delta is None:
                block = torch.zeros(p.plan_floats(self.plans_[ref.key]), dtype=torch.float64)
            else:
                u, s = low_rank_svd(delta.left, delta.right, p.rank)  # float64, as a dense delta's
                block = factor_blocks(u.unsqueeze(0), s.unsqueeze(0), p, shapes[ref.key][1])[0]
            factors[ref.key] = normalise_blocks(block.unsqueeze(0))[0] if p.block_norm else block
        return factors

    def _matrix(self, ck: Checkpoint, layout: Layout, ref: MatrixRef, cache: dict[str, torch.Tensor]) -> torch.Tensor:
        """The fine-tune's matrix as stored (a view of its mapped file), checked against the base's shape."""
        w = ck.matrix(ref, layout.prefix, cache, stored=True)
        if tuple(w.shape) != self.shapes_[ref.key]:
            name = layout.prefix + ref.tensor
            base_stored = list(self.base_.shape(self.layout_.prefix + ref.tensor))
            raise IncompatibleError(
                ck.name, f"tensor {name} has shape {list(ck.shape(name))}, the base's has {base_stored}"
            )
        return w

    def _base(self, ref: MatrixRef, cache: dict[str, torch.Tensor]) -> torch.Tensor:
        """The base's matrix as stored (a view of its mapped file)."""
        return self.base_.matrix(ref, self.layout_.prefix, cache, stored=True)

    def _factors(self, batch: torch.Tensor) -> tuple[torch.Tensor, bool]:
        """(b, block) SVD factors (float64) of a (b, n, m) batch of float32 deltas, and whether they are finite
        (the sketch never forms the deltas: see :meth:`_raw_sketch`).

        The solver works in float64 (:func:`~modelvec.represent.linalg.truncated_svd`), converting the deltas
        a cache-sized chunk at a time on the CPU and whole on a GPU.
        """
        p = self.representation
        chunk = CHUNK_BYTES if self.device.type == "cpu" else None
        try:
            u, s = truncated_svd(
                batch, p.rank, p.solver, n_iter=p.n_iter, n_oversamples=p.n_oversamples, seed=p.seed, chunk_bytes=chunk
            )
            return factor_blocks(u, s, p, batch.shape[-1]), bool(torch.isfinite(s).all())
        except torch.linalg.LinAlgError:  # LAPACK refuses non-finite input (out of memory is not caught here)
            return batch.new_zeros(0), False

    def _layer_factors(self, ck: Checkpoint, layout: Layout, refs: Sequence[MatrixRef]) -> list[torch.Tensor]:
        """Each family's flattened factor for one layer; matrices of one shape share a batched SVD.

        The deltas are written straight into one buffer per shape, in the stored memory order (so
        the subtraction streams contiguously; nn.Linear's transpose is a view). NaN/Inf are caught
        from the r singular values, since they propagate through every product of the solver; only
        then is each delta scanned, to name the tensor. The sketch needs no buffer at all: see
        :meth:`_raw_sketch`.
        """
        cache: dict[str, torch.Tensor] = {}
        base_cache: dict[str, torch.Tensor] = {}
        groups: dict[tuple[tuple[int, ...], Orientation], list[int]] = {}
        for i, ref in enumerate(refs):
            groups.setdefault((self.shapes_[ref.key], ref.orientation), []).append(i)
        factors: list[torch.Tensor | None] = [None] * len(refs)
        for ((n, m), orientation), idx in groups.items():
            linear = orientation is Orientation.LINEAR
            buffer = self._buffer((len(idx), m, n) if linear else (len(idx), n, m))
            batch = buffer.mT if linear else buffer
            for j, i in enumerate(idx):  # converted as they are copied; float32 subtraction of exact upcasts
                batch[j].copy_(self._to_device(self._matrix(ck, layout, refs[i], cache)))
                batch[j].sub_(self._to_device(self._base(refs[i], base_cache)))
            out, finite = self._factors(batch)
            if not finite:
                self._raise_non_finite(ck, layout, [refs[i] for i in idx], batch)
            if self.representation.block_norm:
                out = normalise_blocks(out)
            for i, block in zip(idx, out):
                factors[i] = block
        return factors  # type: ignore[return-value]

    def _family_factors(self, ck: Checkpoint, layout: Layout) -> dict[tuple[str, int, str], torch.Tensor]:
        """Every matrix's factor, each family batched over its layers on the device (see ``batching``).

        A family's matrices go to the device as stored (bf16 stays bf16: half the bytes of float32;
        from pinned memory, asynchronously, where the device is a GPU) and are converted and
        subtracted there, in batches of at most ``_FAMILY_BATCH_BYTES`` of float32 deltas.
        """
        cache: dict[str, torch.Tensor] = {}
        base_cache: dict[str, torch.Tensor] = {}
        factors: dict[tuple[str, int, str], torch.Tensor] = {}
        for group, all_refs in self.families_.items():
            (n, m), orientation = group[2], group[3]
            per_batch = max(1, _FAMILY_BATCH_BYTES // (4 * n * m))
            for start in range(0, len(all_refs), per_batch):
                refs = all_refs[start : start + per_batch]
                stored = self._buffer(self._stored_shape(group, len(refs)))
                for j, ref in enumerate(refs):
                    view = self._stored_view(stored[j], orientation)
                    view.copy_(self._to_device(self._matrix(ck, layout, ref, cache)))
                    view.sub_(self._to_device(self._base(ref, base_cache)))
                batch = self._stored_view(stored, orientation)
                out, finite = self._factors(batch)
                if not finite:
                    self._raise_non_finite(ck, layout, refs, batch)
                if self.representation.block_norm:
                    out = normalise_blocks(out)
                factors.update(zip((r.key for r in refs), out))
        return factors

    @staticmethod
    def _stored_shape(group: tuple, count: int) -> tuple[int, int, int]:
        (n, m), orientation = group[2], group[3]
        return (count, m, n) if orientation is Orientation.LINEAR else (count, n, m)

    @staticmethod
    def _stored_view(stored: torch.Tensor, orientation: Orientation) -> torch.Tensor:
        """A matrix in the description's orientation (n x m) over storage in nn.Linear's (m x n)."""
        return stored.mT if orientation is Orientation.LINEAR else stored

    @staticmethod
    def _raise_non_finite(ck: Checkpoint, layout: Layout, refs: Sequence[MatrixRef], batch: torch.Tensor) -> None:
        for ref, delta in zip(refs, batch):
            if not torch.isfinite(delta).all():
                raise CheckpointError(ck.name, f"tensor {layout.prefix + ref.tensor} has NaN or Inf values")
        raise CheckpointError(
            ck.name, f"the SVD of the deltas of {refs[0].stack} layer {refs[0].layer} did not converge"
        )
