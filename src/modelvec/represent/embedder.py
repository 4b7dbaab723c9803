"""The estimator: :class:`DeltaEmbedder` turns fine-tunes of one base into vectors (``fit`` / ``transform``)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..core.errors import CheckpointError, resource_cause
from ..core.settings import with_options
from ..read import Checkpoint, Layout, MatrixRef, open_checkpoint, refuse_adapter_base
from .blocks import Block, has_head, head_floats, plans_of, vector_blocks
from .device import gpu_pays_for, resolve_device
from .factors import Factoring
from .probe import ProbeInputs
from .representation import Representation
from .sketching import Parent, Sketching
from .trace import Trace, Tracer, entry_positions
from .vocabulary import VocabularyReadout

BATCHINGS = ("auto", "layer", "family")


def _all_finite(w: torch.Tensor, rows: int = 4096) -> bool:
    """No NaN or Inf, checked in slices so that the check of a large matrix allocates little
    (along its storage order: nn.Linear's matrices are transposed views)."""
    if not w.is_contiguous() and w.mT.is_contiguous():
        w = w.mT
    return all(bool(torch.isfinite(w[i : i + rows]).all()) for i in range(0, w.shape[0], rows))


@dataclass(frozen=True)
class Embedded:
    """One model's vector and its :class:`~modelvec.represent.trace.Trace` (None: the representation is not the
    sketch, whose linearity the trace needs)."""

    vector: np.ndarray
    trace: Trace | None = None


class DeltaEmbedder(Sketching, Factoring):
    """Turns fine-tunes of one base into vectors. scikit-learn style: ``fit(base)``, ``transform(models)``.

    ``fit`` opens the base and checks it; its matrices stay in the memory-mapped files, and each
    fine-tune's deltas are formed chunk by chunk from both files, converted from their stored dtype
    (bf16, fp16, float32) only in cache-sized pieces: memory is bounded by a few of the largest
    matrices, not by the model. ``transform`` returns a float32 array (n_models, dim_). Same
    input, same bits.

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
        representation: Representation | None = None,
        *,
        device: str = "auto",
        batching: str = "auto",
        **fields: Any,
    ) -> None:
        """``representation``, or its fields as keywords (``DeltaEmbedder(rank=16, pooling="concat")``), or both
        where they agree (:func:`~modelvec.core.settings.with_options`)."""
        self.representation = with_options(Representation, representation, fields, "DeltaEmbedder")
        self.device = resolve_device(device, gpu_pays=gpu_pays_for(self.representation.uses_svd))
        if batching not in BATCHINGS:
            raise ValueError(f"batching must be one of {', '.join(BATCHINGS)}, not {batching!r}")
        self.batching = batching

    @classmethod
    def from_representation(
        cls, representation: Representation, device: str = "cpu", batching: str = "auto"
    ) -> DeltaEmbedder:
        return cls(representation, device=device, batching=batching)

    # --- fit ----------------------------------------------------------------------------------

    def fit(self, base: str | os.PathLike[str] | Checkpoint, inputs: ProbeInputs | None = None) -> DeltaEmbedder:
        """Open the base and learn its layout and matrix shapes; its weights stay in the (mapped) files.

        Nothing of the base is held in memory: each fine-tune's deltas are formed chunk by chunk
        from both checkpoints' mapped files, in their stored dtype until a chunk is converted, so
        memory is bounded by a few of the largest matrices whatever the model's size. The base is
        read once here, to refuse NaN or Inf before any fine-tune is blamed for them.

        ``inputs``: with ``probe``, the base's inputs to its matrices on the probe (kept beside a store; None:
        computed here, :func:`~modelvec.represent.probe.compute_inputs`, from the base's folder).
        """
        ck = base if isinstance(base, Checkpoint) else open_checkpoint(base)
        refuse_adapter_base(ck.path, ck.name)
        layout = ck.layout()
        shapes: dict[tuple[str, int, str], tuple[int, int]] = {}
        cache: dict[str, torch.Tensor] = {}
        families: dict[tuple, list[MatrixRef]] = {}
        for ref in layout.refs:
            shapes[ref.key] = ck.matrix_shape(ref, layout.prefix)
            families.setdefault((ref.stack, ref.family, shapes[ref.key], ref.orientation), []).append(ref)
            if self.representation.uses_svd and not _all_finite(ck.matrix(ref, layout.prefix, cache, stored=True)):
                raise CheckpointError(ck.name, f"tensor {layout.prefix + ref.tensor} has NaN or Inf values")
        self.base_ = ck
        self.layout_ = layout
        self.shapes_ = shapes
        self.families_ = families
        self.plans_ = plans_of(ck, layout, self.representation)
        self.stored_shapes_ = {ref.tensor: tuple(ck.shape(layout.prefix + ref.tensor)) for ref in layout.refs}
        self.vocabulary_ = (
            VocabularyReadout(ck, layout, head_floats(ck, layout, self.representation), self.representation.seed)
            if has_head(ck, layout, self.representation)
            else None
        )
        if not self.representation.uses_svd:  # the sketch is linear: the base's part once, in float64
            self.projections_ = self._projections(ck, layout, inputs)
            self.trace_projections_ = self._trace_projections(layout)
            self.rows_ = {p.tensor: p.row_ranges for p in self.plans_.values()}  # the rows read: the base's plan
            ck.require_rows(self.rows_)
            sketches = self._map(lambda ref: self._project(ck, layout, ref), layout.refs)
            for ref, (sk, tr) in zip(layout.refs, sketches):
                if not bool(torch.isfinite(sk).all() and torch.isfinite(tr).all()):
                    raise CheckpointError(ck.name, f"tensor {layout.prefix + ref.tensor} has NaN or Inf values")
            self.base_sketches_ = {r.key: sk for r, (sk, _) in zip(layout.refs, sketches)}
            self.base_traces_ = {r.key: tr for r, (_, tr) in zip(layout.refs, sketches)}
            self.tracer_ = Tracer(
                {key: int(tr.numel()) for key, tr in self.base_traces_.items()}, self.representation.seed
            )
            self.base_scale_ = float(np.linalg.norm(self.tracer_.sketch(self.base_traces_)))
            rows = self._map(lambda ref: self._level_rows(ck, layout, ref), layout.refs)
            self.base_rows_ = dict(zip((r.key for r in layout.refs), rows))  # 16 rows a matrix: views of the base
            shapes_read = {key: (int(r.shape[0]), int(r.shape[1])) for key, r in self.base_rows_.items()}
            self.entry_positions_ = entry_positions(shapes_read, self.representation.seed)
        self.blocks_ = self._blocks(layout)
        self.dim_ = self.blocks_[-1].stop
        return self

    def _blocks(self, layout: Layout) -> list[Block]:
        floats = self.vocabulary_.floats if self.vocabulary_ is not None else 0
        return vector_blocks(layout, self.plans_, self.representation, floats)

    # --- transform ----------------------------------------------------------------------------

    def transform(self, models: Iterable[str | os.PathLike[str] | Checkpoint]) -> np.ndarray:
        """Vectors of the fine-tunes, (n_models, dim_) float32. Raises on the first bad model."""
        vectors = [self.embed_one(m) for m in models]
        return np.stack(vectors) if vectors else np.zeros((0, self.dim_), np.float32)

    def embed_one(
        self, model: str | os.PathLike[str] | Checkpoint, parent: str | os.PathLike[str] | Checkpoint | None = None
    ) -> np.ndarray:
        """One fine-tune's vector, float32 (dim_,). A PEFT LoRA adapter folder is a fine-tune too; one trained on a
        fine-tune of the base is embedded on that ``parent`` (see :meth:`embed_traced`)."""
        return self.embed_traced(model, parent).vector

    def embed_traced(
        self,
        model: str | os.PathLike[str] | Checkpoint,
        parent: str | os.PathLike[str] | Checkpoint | Parent | None = None,
    ) -> Embedded:
        """One fine-tune's vector and trace.

        An adapter's vector is computed from its factors (see :meth:`_adapter_raw`) and equals,
        up to float rounding, the vector of the model PEFT's ``merge_and_unload`` would give.

        Out of memory while batching per family (a GPU's default) is retried once, layer by layer
        on the CPU, which needs a few matrices at a time; out of memory there too raises (a
        :class:`~modelvec.core.errors.ResourceError` to the pipeline: recorded, retried next run).

        An adapter trained on a fine-tune of the base (``parent``: the fine-tune, a full model) is the fine-tune's
        delta plus its own: the parent's raw blocks, read once and kept for its other adapters, plus the adapter's,
        then normalised as any model's (the sketch only: the SVD factors of a sum are not a sum).
        """
        try:
            return self._embed_one(model, parent)
        except Exception as exc:
            if resource_cause(exc) is None or not self.by_family:
                raise
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            return self._smaller()._embed_one(model, parent)

    def _smaller(self) -> DeltaEmbedder:
        """The same representation, layer by layer on the CPU, fitted on the same base (made once)."""
        smaller = self.__dict__.get("_smaller_embedder")
        if smaller is None:
            smaller = DeltaEmbedder.from_representation(self.representation, "cpu", "layer").fit(
                self.base_, getattr(self, "inputs_", None)
            )
            self.__dict__["_smaller_embedder"] = smaller
        return smaller

    def _embed_one(
        self,
        model: str | os.PathLike[str] | Checkpoint,
        parent: str | os.PathLike[str] | Checkpoint | Parent | None = None,
    ) -> Embedded:
        self._check_fitted()
        ck = model if isinstance(model, Checkpoint) else open_checkpoint(model)
        parent_beta = None
        if parent is not None:
            vector, trace, parent_beta = self._on_parent(ck, parent)
        elif not self.representation.uses_svd:
            raw, traw, stats = self._raw_blocks(ck)
            sketch = self.tracer_.sketch(traw)
            trace = stats.trace(sketch, self.base_scale_) if stats else Trace(sketch, None, self.base_scale_)
            vector = self._sketched(raw)
        else:
            vector, trace = self._delta_vector(ck), None
        if self.vocabulary_ is None:
            return Embedded(vector, trace)
        beta = self.vocabulary_.bias(ck)
        beta = parent_beta if beta is None else beta  # an adapter's own head where it trains one, else its parent's
        head = self.vocabulary_.block_of(beta, float(np.linalg.norm(vector)) or 1.0)
        return Embedded(np.concatenate([vector, head.numpy()]), trace)

    def __getstate__(self) -> dict:
        """Picklable (Ray ships embedders' parameters): the thread pool and scratch buffers stay behind."""
        return {
            k: v
            for k, v in self.__dict__.items()
            if k not in ("_threads", "_buffers", "_chunks", "_smaller_embedder", "_parents")
        }

    def _check_fitted(self) -> None:
        if not hasattr(self, "shapes_"):
            raise RuntimeError("call fit(base) before transform")
