"""The estimator: :class:`DeltaEmbedder` turns fine-tunes of one base into vectors (``fit`` / ``transform``)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from ..core.errors import CheckpointError, IncompatibleError, resource_cause
from ..read import Checkpoint, Layout, MatrixRef, Orientation, check_compatible, open_checkpoint
from .linalg import factor_blocks, low_rank_svd, normalise_blocks, sketch_matrix, truncated_svd
from .params import Representation

BATCHINGS = ("auto", "layer", "family")
_CHUNK_BYTES = 2 << 20  # a delta chunk that stays in cache (L3) between the subtraction and the product


@dataclass(frozen=True)
class Block:
    """Where one matrix's factor sits in the vector: [start, stop). ``layer`` is None when pooled."""

    stack: str
    layer: int | None
    family: str
    n: int
    start: int
    stop: int


class DeltaEmbedder:
    """Turns fine-tunes of one base into vectors. scikit-learn style: ``fit(base)``, ``transform(models)``.

    ``fit`` reads the base's matrices once (float32, kept in memory) and reuses them for every
    fine-tune; ``transform`` returns a float32 array (n_models, dim_). Same input, same bits.

    ``batching`` says how deltas are grouped for the linear algebra. ``"layer"`` (the CPU
    default) works through one layer at a time, so memory holds one layer's deltas at most; for
    the default sketch it streams each delta in cache-sized chunks straight into the product,
    so no delta is ever written out whole. ``"family"`` stacks one family's matrices over all
    layers (all q, all ff1, ...) into one batched product or SVD: what a GPU needs to be busy,
    and the default on any device other than the CPU. Both give the same vector up to float
    rounding.
    """

    def __init__(
        self,
        rank: int = Representation.rank,
        factor: str = Representation.factor,
        pooling: str = Representation.pooling,
        solver: str = Representation.solver,
        sign: str = Representation.sign,
        *,
        n_iter: int = Representation.n_iter,
        n_oversamples: int = Representation.n_oversamples,
        seed: int = Representation.seed,
        block_norm: bool = Representation.block_norm,
        device: str = "cpu",
        batching: str = "auto",
    ) -> None:
        self.params = Representation(rank, factor, pooling, solver, sign, n_iter, n_oversamples, seed, block_norm)
        self.device = torch.device(device)
        if batching not in BATCHINGS:
            raise ValueError(f"batching must be one of {', '.join(BATCHINGS)}, not {batching!r}")
        self.batching = batching

    @classmethod
    def from_params(cls, params: Representation, device: str = "cpu", batching: str = "auto") -> DeltaEmbedder:
        return cls(**params.as_dict(), device=device, batching=batching)  # type: ignore[arg-type]

    @property
    def by_family(self) -> bool:
        """Whether deltas are batched per family across layers (see the class docstring)."""
        return self.batching == "family" or (self.batching == "auto" and self.device.type != "cpu")

    # --- fit ----------------------------------------------------------------------------------
    def fit(self, base: str | os.PathLike[str] | Checkpoint) -> DeltaEmbedder:
        """Read the base's matrices once; they are reused for every fine-tune.

        Batched per family, each family's base matrices are stacked on the device in their
        stored memory order, and ``weights_`` holds views into the stacks (no second copy).
        """
        ck = base if isinstance(base, Checkpoint) else Checkpoint(base)
        layout = ck.layout()
        weights: dict[tuple[str, int, str], torch.Tensor] = {}
        cache: dict[str, torch.Tensor] = {}
        families: dict[tuple, list[MatrixRef]] = {}
        stacks: dict[tuple, torch.Tensor] = {}
        for ref in layout.refs:
            w = ck.matrix(ref, layout.prefix, cache)
            if not torch.isfinite(w).all():
                raise CheckpointError(ck.name, f"tensor {layout.prefix + ref.tensor} has NaN or Inf values")
            if self.by_family:
                families.setdefault((ref.stack, ref.family, tuple(w.shape), ref.orientation), []).append(ref)
            weights[ref.key] = w if self.by_family else w.to(self.device)
        if self.by_family:
            for group, refs in families.items():
                stack = torch.empty(self._stored_shape(group, len(refs)), device=self.device)
                for j, ref in enumerate(refs):
                    view = self._stored_view(stack[j], ref.orientation)
                    view.copy_(weights[ref.key])
                    weights[ref.key] = view
                stacks[group] = stack
        self.base_ = ck
        self.layout_ = layout
        self.weights_ = weights
        self.families_ = families
        self.family_stacks_ = stacks
        self.blocks_ = self._blocks(layout)
        self.dim_ = self.blocks_[-1].stop
        return self

    @staticmethod
    def _stored_shape(group: tuple, count: int) -> tuple[int, int, int]:
        (n, m), orientation = group[2], group[3]
        return (count, m, n) if orientation is Orientation.LINEAR else (count, n, m)

    @staticmethod
    def _stored_view(stored: torch.Tensor, orientation: Orientation) -> torch.Tensor:
        """A matrix in the description's orientation (n x m) over storage in nn.Linear's (m x n)."""
        return stored.mT if orientation is Orientation.LINEAR else stored

    def _blocks(self, layout: Layout) -> list[Block]:
        blocks: list[Block] = []
        pos = 0
        for stack, layer, refs in layout.by_layer():
            if self.params.pooling == "mean" and layer > 0:
                continue
            for ref in refs:
                n = self.weights_[ref.key].shape[0]
                size = self.params.block_size(n)
                blocks.append(
                    Block(stack, layer if self.params.pooling == "concat" else None, ref.family, n, pos, pos + size)
                )
                pos += size
        return blocks

    # --- transform ----------------------------------------------------------------------------
    def transform(self, models: Iterable[str | os.PathLike[str] | Checkpoint]) -> np.ndarray:
        """Vectors of the fine-tunes, (n_models, dim_) float32. Raises on the first bad model."""
        vectors = [self.embed_one(m) for m in models]
        return np.stack(vectors) if vectors else np.zeros((0, self.dim_), np.float32)

    def embed_one(self, model: str | os.PathLike[str] | Checkpoint) -> np.ndarray:
        """One fine-tune's vector, float32 (dim_,). A PEFT LoRA adapter folder is a fine-tune too.

        An adapter's vector is computed from its factors (see :meth:`_adapter_factors`) and equals,
        up to float rounding, the vector of the model PEFT's ``merge_and_unload`` would give.

        Out of memory while batching per family (a GPU's default) is retried once, layer by layer
        on the CPU, which needs a few matrices at a time; out of memory there too raises (a
        :class:`~modelvec.core.errors.ResourceError` to the pipeline: recorded, retried next run).
        """
        try:
            return self._embed_one(model)
        except Exception as exc:
            if resource_cause(exc) is None or not self.by_family:
                raise
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            return self._smaller()._embed_one(model)

    def _smaller(self) -> DeltaEmbedder:
        """The same representation, layer by layer on the CPU, fitted on the same base (made once)."""
        smaller = self.__dict__.get("_smaller_embedder")
        if smaller is None:
            smaller = DeltaEmbedder.from_params(self.params, "cpu", "layer").fit(self.base_)
            self.__dict__["_smaller_embedder"] = smaller
        return smaller

    def _embed_one(self, model: str | os.PathLike[str] | Checkpoint) -> np.ndarray:
        self._check_fitted()
        ck = model if isinstance(model, Checkpoint) else open_checkpoint(model)
        if ck.factored:  # a LoRA adapter: its delta comes as thin factors
            factors = self._adapter_factors(ck)
            return self._pooled(self.layout_, lambda refs: [factors[r.key] for r in refs])
        layout = ck.layout()
        check_compatible(ck, layout, self.layout_)
        if self.by_family:
            by_key = self._family_factors(ck, layout)
        elif self._streams_sketch:
            cache: dict[str, torch.Tensor] = {}
            failed = threading.Event()  # after one matrix fails, the others are not read: the model is done

            def sketch(ref: MatrixRef) -> torch.Tensor | None:
                if failed.is_set():
                    return None
                try:
                    return self._sketch_streamed(ck, layout, ref, cache)
                except BaseException:
                    failed.set()
                    raise

            sketches = list(self._pool().map(sketch, layout.refs))
            by_key = {ref.key: s for ref, s in zip(layout.refs, sketches) if s is not None}
        else:
            return self._pooled(layout, lambda refs: self._layer_factors(ck, layout, refs))
        return self._pooled(layout, lambda refs: [by_key[r.key] for r in refs])

    def _pooled(self, layout: Layout, factors_of: Callable[[list[MatrixRef]], list[torch.Tensor]]) -> np.ndarray:
        """The vector: each layer's factors concatenated, layers pooled, stacks concatenated."""
        stacks: dict[str, list[torch.Tensor]] = {}
        counts: dict[str, int] = {}
        for stack, _layer, refs in layout.by_layer():
            layer_vec = torch.cat(factors_of(refs))
            if self.params.pooling == "mean":
                acc = stacks.setdefault(stack, [torch.zeros_like(layer_vec)])
                acc[0] += layer_vec
                counts[stack] = counts.get(stack, 0) + 1
            else:
                stacks.setdefault(stack, []).append(layer_vec)
        parts = [
            acc[0] / counts[name] if self.params.pooling == "mean" else torch.cat(acc) for name, acc in stacks.items()
        ]
        return torch.cat(parts).to("cpu", torch.float32).numpy()

    def _adapter_factors(self, ck: Checkpoint) -> dict[tuple[str, int, str], torch.Tensor]:
        """Every matrix's factor from an adapter's dW = L R^T (n x r, m x r), never forming the n x m delta.

        The sketch is L (R^T Omega), the SVD factors come from :func:`low_rank_svd` (exact, whatever
        ``solver`` says), in float64 and then through the same :func:`factor_blocks` (signs, zero
        columns beyond the adapter's rank) as dense deltas. A matrix the adapter leaves alone has
        dW = 0: its block is zeros, as a merged model's would be.
        """
        p = self.params
        shapes = {ref.key: tuple(self.weights_[ref.key].shape) for ref in self.layout_.refs}
        deltas = ck.low_rank_deltas(self.layout_, shapes)
        factors: dict[tuple[str, int, str], torch.Tensor] = {}
        for ref in self.layout_.refs:
            n, m = shapes[ref.key]
            delta = deltas.get(ref.key)
            if delta is None:
                block = torch.zeros(p.block_size(n))
            elif p.uses_svd:
                u, s = low_rank_svd(delta.left, delta.right, p.rank)
                block = factor_blocks(u.float().unsqueeze(0), s.float().unsqueeze(0), p, m)[0]
            else:  # (dW Omega)^T = (Omega^T R) L^T, rank x n, flattened as the dense path does
                omega_t = self._omega_t(m).to("cpu", torch.float64)
                block = ((omega_t @ delta.right) @ delta.left.mT).reshape(-1).float()
            factors[ref.key] = normalise_blocks(block.unsqueeze(0))[0] if p.block_norm else block
        return factors

    def _matrix(self, ck: Checkpoint, layout: Layout, ref: MatrixRef, cache: dict[str, torch.Tensor]) -> torch.Tensor:
        """The fine-tune's matrix (on the CPU, mapped from its file where possible), checked against the base's shape."""
        w = ck.matrix(ref, layout.prefix, cache)
        if w.shape != self.weights_[ref.key].shape:
            name = layout.prefix + ref.tensor
            base_stored = list(self.base_.shape(self.layout_.prefix + ref.tensor))
            raise IncompatibleError(
                ck.name, f"tensor {name} has shape {list(ck.shape(name))}, the base's has {base_stored}"
            )
        return w

    def _omega_t(self, m: int) -> torch.Tensor:
        """The sketch's Omega^T (rank x m) on the device, made once per width."""
        omegas = self.__dict__.setdefault("_omegas", {})
        if m not in omegas:
            omegas[m] = sketch_matrix(m, self.params.rank, self.params.seed, self.device).mT.contiguous()
        return omegas[m]

    def _factors(self, batch: torch.Tensor) -> tuple[torch.Tensor, bool]:
        """(b, block) factors of a (b, n, m) batch of deltas, and whether they are finite."""
        p = self.params
        m = batch.shape[-1]
        try:
            if p.uses_svd:
                u, s = truncated_svd(
                    batch, p.rank, p.solver, n_iter=p.n_iter, n_oversamples=p.n_oversamples, seed=p.seed
                )
                return factor_blocks(u, s, p, m), bool(torch.isfinite(s).all())
            # (dW Omega)^T = Omega^T dW^T, computed in that form: a wide product, ~5x faster
            # than the skinny dW @ Omega on CPU BLAS; its rows are the columns of dW Omega.
            out = (self._omega_t(m) @ batch.mT).reshape(len(batch), -1)
            return out, bool(torch.isfinite(out).all())
        except torch.linalg.LinAlgError:  # LAPACK refuses non-finite input (out of memory is not caught here)
            return batch.new_zeros(0), False

    def _layer_factors(self, ck: Checkpoint, layout: Layout, refs: Sequence[MatrixRef]) -> list[torch.Tensor]:
        """Each family's flattened factor for one layer; matrices of one shape share a batched SVD.

        The deltas are written straight into one buffer per shape, in the stored memory order (so
        the subtraction streams contiguously; nn.Linear's transpose is a view). NaN/Inf are caught
        from the r singular values, since they propagate through every product of the solver; only
        then is each delta scanned, to name the tensor. The sketch needs no buffer at all: see
        :meth:`_sketch_streamed`.
        """
        cache: dict[str, torch.Tensor] = {}
        groups: dict[tuple[tuple[int, ...], Orientation], list[int]] = {}
        for i, ref in enumerate(refs):
            groups.setdefault((tuple(self.weights_[ref.key].shape), ref.orientation), []).append(i)
        factors: list[torch.Tensor | None] = [None] * len(refs)
        for ((n, m), orientation), idx in groups.items():
            linear = orientation is Orientation.LINEAR
            buffer = self._buffer((len(idx), m, n) if linear else (len(idx), n, m))
            batch = buffer.mT if linear else buffer
            for j, i in enumerate(idx):
                torch.sub(self._matrix(ck, layout, refs[i], cache), self.weights_[refs[i].key], out=batch[j])
            out, finite = self._factors(batch)
            if not finite:
                self._raise_non_finite(ck, layout, [refs[i] for i in idx], batch)
            if self.params.block_norm:
                out = normalise_blocks(out)
            for i, block in zip(idx, out):
                factors[i] = block
        return factors  # type: ignore[return-value]

    @property
    def _streams_sketch(self) -> bool:
        return not self.params.uses_svd and self.device.type == "cpu" and not self.by_family

    def _pool(self) -> ThreadPoolExecutor:
        """Threads for the streamed sketch, one matrix each, torch single-threaded in each.

        Each matrix is many small operations on cache-sized chunks; splitting every one of them
        over torch's threads costs a synchronisation per chunk (and collapses when another
        process holds a core), while whole matrices on separate threads need none: ~1.6x
        faster on 2 cores. One thread per core torch would use.
        """
        pool = self.__dict__.get("_threads")
        if pool is None:
            pool = self.__dict__["_threads"] = ThreadPoolExecutor(
                torch.get_num_threads(),
                thread_name_prefix="modelvec-sketch",
                initializer=torch.set_num_threads,
                initargs=(1,),
            )
        return pool

    def __getstate__(self) -> dict:
        """Picklable (Ray ships embedders' parameters): the thread pool and scratch buffers stay behind."""
        return {
            k: v for k, v in self.__dict__.items() if k not in ("_threads", "_buffers", "_chunks", "_smaller_embedder")
        }

    def _sketch_streamed(
        self, ck: Checkpoint, layout: Layout, ref: MatrixRef, cache: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        """One matrix's sketch Omega^T dW^T, the delta streamed through a cache-sized buffer.

        Reading both matrices and writing the whole delta out, then reading it again for the
        product, moves three matrices through memory; here each chunk of ~2 MB (whole rows of
        the stored matrix) is subtracted and multiplied while it is still in cache.
        """
        w, b = self._matrix(ck, layout, ref, cache), self.weights_[ref.key]
        n, m = w.shape
        omega_t = self._omega_t(m)
        out = torch.empty(self.params.rank, n)
        if w.stride(0) == 1:  # nn.Linear storage: the columns of dW are contiguous; sum over chunks of them
            step = max(1, _CHUNK_BYTES // (4 * n))
            for start in range(0, m, step):
                stop = min(m, start + step)
                delta = self._chunk((stop - start, n))
                torch.sub(w[:, start:stop].T, b[:, start:stop].T, out=delta)
                if start == 0:
                    torch.mm(omega_t[:, :stop], delta, out=out)
                else:
                    out.addmm_(omega_t[:, start:stop], delta)
        else:  # Conv1D storage: rows of dW are contiguous; each chunk gives its own columns of the sketch
            out_t = torch.empty(n, self.params.rank)
            step = max(1, _CHUNK_BYTES // (4 * m))
            for start in range(0, n, step):
                stop = min(n, start + step)
                delta = self._chunk((stop - start, m))
                torch.sub(w[start:stop], b[start:stop], out=delta)
                torch.mm(delta, omega_t.T, out=out_t[start:stop])
            out = out_t.T
        if not torch.isfinite(out).all():
            self._raise_non_finite(ck, layout, [ref], (self._matrix(ck, layout, ref, cache) - b).unsqueeze(0))
        block = out.reshape(1, -1)
        return (normalise_blocks(block) if self.params.block_norm else block)[0]

    def _family_factors(self, ck: Checkpoint, layout: Layout) -> dict[tuple[str, int, str], torch.Tensor]:
        """Every matrix's factor, each family batched over its layers on the device (see ``batching``)."""
        cache: dict[str, torch.Tensor] = {}
        factors: dict[tuple[str, int, str], torch.Tensor] = {}
        for group, refs in self.families_.items():
            base = self.family_stacks_[group]
            stored = self._buffer(tuple(base.shape))
            for j, ref in enumerate(refs):
                self._stored_view(stored[j], ref.orientation).copy_(self._matrix(ck, layout, ref, cache))
            stored.sub_(base)
            batch = self._stored_view(stored, group[3])
            out, finite = self._factors(batch)
            if not finite:
                self._raise_non_finite(ck, layout, refs, batch)
            if self.params.block_norm:
                out = normalise_blocks(out)
            factors.update(zip((r.key for r in refs), out))
        return factors

    def _buffer(self, shape: tuple[int, ...]) -> torch.Tensor:
        """A reused scratch buffer per shape: fresh large allocations page-fault on every model."""
        buffers = self.__dict__.setdefault("_buffers", {})
        if shape not in buffers:
            buffers[shape] = torch.empty(shape, device=self.device)
        return buffers[shape]

    def _chunk(self, shape: tuple[int, int]) -> torch.Tensor:
        """A chunk buffer of the calling thread (each sketch thread streams its own matrix)."""
        local = self.__dict__.setdefault("_chunks", threading.local())
        buffers = local.__dict__.setdefault("buffers", {})
        if shape not in buffers:
            buffers[shape] = torch.empty(shape)
        return buffers[shape]

    @staticmethod
    def _raise_non_finite(ck: Checkpoint, layout: Layout, refs: Sequence[MatrixRef], batch: torch.Tensor) -> None:
        for ref, delta in zip(refs, batch):
            if not torch.isfinite(delta).all():
                raise CheckpointError(ck.name, f"tensor {layout.prefix + ref.tensor} has NaN or Inf values")
        raise CheckpointError(
            ck.name, f"the SVD of the deltas of {refs[0].stack} layer {refs[0].layer} did not converge"
        )

    def _check_fitted(self) -> None:
        if not hasattr(self, "weights_"):
            raise RuntimeError("call fit(base) before transform")
