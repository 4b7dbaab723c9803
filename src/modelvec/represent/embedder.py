"""The estimator: :class:`DeltaEmbedder` turns fine-tunes of one base into vectors (``fit`` / ``transform``)."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from ..core.errors import ArchitectureError, CheckpointError, IncompatibleError, resource_cause
from ..core.settings import with_options
from ..read import Checkpoint, Layout, MatrixRef, Orientation, check_compatible, open_checkpoint, refuse_adapter_base
from .blocks import Block, has_head, head_floats, plans_of, vector_blocks
from .device import gpu_pays_for, resolve_device
from .linalg import CHUNK_BYTES, factor_blocks, low_rank_svd, normalise_blocks, truncated_svd
from .plans import MatrixPlan, derived_seed
from .probe import ProbeInputs, compute_inputs
from .projection import ProbeProjection, Projection
from .representation import Representation
from .trace import LEVEL_ROWS, RowStats, Trace, Tracer, row_stats

BATCHINGS = ("auto", "layer", "family")
_CHUNK_BYTES = 2 << 20  # a delta chunk that stays in cache (L3) between the subtraction and the product
_FAMILY_BATCH_BYTES = 1 << 30  # float32 deltas per batched family product: bounded whatever the depth
#: Parents (fine-tunes that adapters were trained on) whose raw blocks an embedder keeps, the most recently used: an
#: 8B parent's are ~26 MB under the default size budget (100,000 floats a layer, float64: a sum of float64 blocks is
#: what gives an adapter the bits of its merged model).
PARENTS_KEPT = 4
_PARENTS_LOCK = threading.Lock()  # guards every embedder's kept parents (never pickled: module state)


def _all_finite(w: torch.Tensor, rows: int = 4096) -> bool:
    """No NaN or Inf, checked in slices so that the check of a large matrix allocates little
    (along its storage order: nn.Linear's matrices are transposed views)."""
    if not w.is_contiguous() and w.mT.is_contiguous():
        w = w.mT
    return all(bool(torch.isfinite(w[i : i + rows]).all()) for i in range(0, w.shape[0], rows))


class VocabularyReadout:
    """The head's vocabulary prior of a model, E (beta - beta_base), read through the base's embeddings E.

    See :class:`~modelvec.read.architectures.VocabularyHead` for what it is and
    :class:`~modelvec.represent.representation.Representation` (``head``) for how it enters the vector.
    """

    _ROWS = 8192  # rows of E converted to float64 at a time

    def __init__(self, base: Checkpoint, layout: Layout, floats: int | None = None, seed: int = 0) -> None:
        """``floats``: the block's size where the vector's size budget makes it smaller than the vocabulary (its
        prior then CountSketched into that many buckets, seeded by ``seed``; None: the vocabulary's)."""
        head = layout.arch.vocabulary_head
        if head is None:
            raise ArchitectureError(
                base.name,
                f"head='vocabulary' needs a family whose head ends in the vocabulary through a norm with a "
                f"bias (bert, roberta, distilbert, gpt2); {layout.arch.name} has none",
            )
        key = base.find(head.embedding)
        if key is None:
            raise CheckpointError(
                base.name, f"no embedding matrix {head.embedding} to read the vocabulary head through"
            )
        self.names = head.bias
        self.embedding = base.get_stored(key)  # (vocab, width), a view of the mapped file
        if self.embedding.ndim != 2:
            raise CheckpointError(base.name, f"tensor {key} has shape {list(self.embedding.shape)}, expected a matrix")
        self.vocab, self.width = (int(d) for d in self.embedding.shape)
        self.floats = self.vocab if floats is None else floats
        self.buckets: tuple[torch.Tensor, torch.Tensor] | None = None
        if self.floats < self.vocab:  # a CountSketch of the prior: a bucket and a sign per token, fixed by the seed
            gen = torch.Generator().manual_seed(derived_seed(seed, "countsketch", "head"))
            self.buckets = (
                torch.randint(0, self.floats, (self.vocab,), generator=gen),
                (torch.randint(0, 2, (self.vocab,), generator=gen) * 2 - 1).double(),
            )
        base_bias = self.bias(base)
        self.base_bias = torch.zeros(self.width, dtype=torch.float64) if base_bias is None else base_bias

    def bias(self, ck: Checkpoint) -> torch.Tensor | None:
        """The head's beta in ``ck`` (float64), None when it has no such head (a classifier, an encoder alone)."""
        key = next((k for k in (ck.find(n) for n in self.names) if k is not None), None)
        if key is None:
            return None
        beta = ck.get(key).double()
        if tuple(beta.shape) != (self.width,):
            raise IncompatibleError(
                ck.name, f"tensor {key} has shape {list(beta.shape)}, the embeddings' width is {self.width}"
            )
        if not bool(torch.isfinite(beta).all()):
            raise CheckpointError(ck.name, f"tensor {key} has NaN or Inf values")
        return beta

    def block(self, ck: Checkpoint, scale: float) -> torch.Tensor:
        """The head's block of ``ck``'s vector: E (beta - beta_base) centred over the vocabulary, norm ``scale``."""
        return self.block_of(self.bias(ck), scale)

    def block_of(self, beta: torch.Tensor | None, scale: float) -> torch.Tensor:
        """The head's block of a model whose head's beta is ``beta`` (None: it has none), norm ``scale``."""
        if beta is None:
            return torch.zeros(self.floats)
        delta = beta - self.base_bias
        prior = torch.cat(
            [self.embedding[i : i + self._ROWS].double() @ delta for i in range(0, self.vocab, self._ROWS)]
        )
        prior -= prior.mean()
        norm = float(prior.norm())
        if norm == 0:
            return torch.zeros(self.floats)
        prior *= scale / norm
        if self.buckets is not None:  # linear and unbiased: inner products of sketched priors are exact on average
            where, sign = self.buckets
            prior = torch.zeros(self.floats, dtype=torch.float64).index_add_(0, where, prior * sign)
        return prior.float()


@dataclass(frozen=True)
class Parent:
    """An adapter's parent fine-tune as a run knows it: ``version``, what the weights are named by (a Hub commit, its
    files' stamp), which its read rows are kept by for its other adapters; ``open``, how to open it, called only
    where they are not kept. The embedder closes what ``open`` gives."""

    version: str
    open: Callable[[], Checkpoint]


_Blocks = dict[tuple[str, int, str], torch.Tensor]  # a model's raw blocks, by matrix (stack, layer, family)


@dataclass(frozen=True)
class _ParentRows:
    """What an adapter needs of its parent, read once: each matrix's raw sketch block (float64), its trace's (the same
    where the vector's is the delta's own sketch) and its head's beta (None: it has no vocabulary head, or none is
    read)."""

    raw: dict[tuple[str, int, str], torch.Tensor]
    traw: dict[tuple[str, int, str], torch.Tensor]
    beta: torch.Tensor | None


@dataclass(frozen=True)
class Embedded:
    """One model's vector and its :class:`~modelvec.represent.trace.Trace` (None: the representation is not the
    sketch, whose linearity the trace needs)."""

    vector: np.ndarray
    trace: Trace | None = None


class DeltaEmbedder:
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

    @property
    def by_family(self) -> bool:
        """Whether deltas are batched per family across layers (see the class docstring)."""
        return self.batching == "family" or (self.batching == "auto" and self.device.type != "cpu")

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
            ck.require_rows({p.tensor: p.row_ranges for p in self.plans_.values()})
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
        self.blocks_ = self._blocks(layout)
        self.dim_ = self.blocks_[-1].stop
        return self

    def _projections(
        self, ck: Checkpoint, layout: Layout, inputs: ProbeInputs | None
    ) -> dict[tuple[str, int, str], Projection | ProbeProjection]:
        """Each matrix's fixed map to its block: a random projection of its delta, or of its delta through the
        base's inputs (``probe``: ``inputs``, computed from the base's folder where not given)."""
        rep = self.representation
        tokens = rep.probe_tokens(layout.arch.probe)
        if tokens is None:
            omegas: dict[int, torch.Tensor] = {}  # the shared projection's Omega^T, one per width
            return {
                ref.key: Projection(self.plans_[ref.key], rep, (ref.stack, ref.layer, ref.family), self.device, omegas)
                for ref in layout.refs
            }
        if inputs is None:
            inputs = compute_inputs(ck.path if ck.path.is_dir() else ck.path.parent, layout, tokens, ck.name)
        if inputs.tokens != tokens or any(ref.tensor not in inputs.of for ref in layout.refs):
            raise ValueError(f"the probe inputs given are not {ck.name}'s on {tokens} tokens")
        self.inputs_ = inputs
        h = {name: torch.from_numpy(np.array(a, np.float64)).to(self.device) for name, a in inputs.arrays.items()}
        return {
            ref.key: ProbeProjection(
                self.plans_[ref.key],
                rep,
                (ref.stack, ref.layer, ref.family),
                self.device,
                h[inputs.of[ref.tensor]],
            )
            for ref in layout.refs
        }

    def _trace_projections(self, layout: Layout) -> dict[tuple[str, int, str], Projection | ProbeProjection]:
        """What the traces sketch: the delta's own CountSketch (the tree's evidence was measured on it), the vector's
        projections where they are that already; a second map of the same rows where the vector's go through the
        probe."""
        if self.representation.probe_tokens(layout.arch.probe) is None:
            return self.projections_
        plain = replace(self.representation, probe="none")
        return {
            ref.key: Projection(self.plans_[ref.key], plain, (ref.stack, ref.layer, ref.family), self.device)
            for ref in layout.refs
        }

    @staticmethod
    def _stored_shape(group: tuple, count: int) -> tuple[int, int, int]:
        (n, m), orientation = group[2], group[3]
        return (count, m, n) if orientation is Orientation.LINEAR else (count, n, m)

    @staticmethod
    def _stored_view(stored: torch.Tensor, orientation: Orientation) -> torch.Tensor:
        """A matrix in the description's orientation (n x m) over storage in nn.Linear's (m x n)."""
        return stored.mT if orientation is Orientation.LINEAR else stored

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

    def _on_parent(
        self, ck: Checkpoint, parent: str | os.PathLike[str] | Checkpoint | Parent
    ) -> tuple[np.ndarray, Trace, torch.Tensor | None]:
        """An adapter's vector and trace on its parent's delta, and the parent's head's beta (the model's head where
        the adapter trains none)."""
        if not ck.factored:
            raise CheckpointError(ck.name, "only a LoRA adapter is embedded on a parent: a full model is its weights")
        if self.representation.uses_svd:
            raise CheckpointError(
                ck.name, "an adapter on a fine-tune is embedded with the sketch only (factor='sketch')"
            )
        rows = self._parent_rows(ck, parent)  # the parent's row statistics are not the adapter's: it has none
        own, town = self._adapter_raw(ck)
        raw = {key: block + own[key] if key in own else block for key, block in rows.raw.items()}
        traw = {key: block + town[key] if key in town else block for key, block in rows.traw.items()}
        return self._sketched(raw), Trace(self.tracer_.sketch(traw), None, self.base_scale_), rows.beta

    def _parent_rows(self, ck: Checkpoint, parent: str | os.PathLike[str] | Checkpoint | Parent) -> _ParentRows:
        """The parent's rows as its adapters need them, read once for all of them: kept by the parent's version for
        the next adapter (the :data:`PARENTS_KEPT` most recently used; never pickled)."""
        if not isinstance(parent, Parent):  # a folder or checkpoint: named by its files' stamp
            pk = parent if isinstance(parent, Checkpoint) else open_checkpoint(parent)
            return self._parent_rows(ck, Parent(pk.stamp(), lambda: pk))
        with _PARENTS_LOCK:  # the engine's threads embed adapters side by side
            kept: OrderedDict[str, _ParentRows] = self.__dict__.setdefault("_parents", OrderedDict())
            if parent.version in kept:
                kept.move_to_end(parent.version)
                return kept[parent.version]
        pk = parent.open()
        try:
            if pk.factored:
                raise CheckpointError(ck.name, f"its parent {pk.name} is an adapter too: give the merged fine-tune")
            raw, traw, _ = self._raw_blocks(pk)
            rows = _ParentRows(raw, traw, self.vocabulary_.bias(pk) if self.vocabulary_ is not None else None)
        finally:
            pk.close()  # its files released now: its rows are kept (a checkpoint reopens them if read again)
        with _PARENTS_LOCK:
            kept[parent.version] = rows
            while len(kept) > PARENTS_KEPT:
                kept.popitem(last=False)
        return rows

    def _raw_blocks(self, ck: Checkpoint) -> tuple[_Blocks, _Blocks, RowStats | None]:
        """The sketch's raw blocks of ``ck``'s delta (float64, before their norm), its trace's (the same where the
        vector's are the delta's own sketch), and what its first rows read say beside the base's (None for an
        adapter: see :mod:`~modelvec.represent.trace`)."""
        if ck.factored:  # a LoRA adapter: its delta comes as thin factors
            return *self._adapter_raw(ck), None
        layout = ck.layout()
        check_compatible(ck, layout, self.layout_)
        ck.require_rows({p.tensor: p.row_ranges for p in self._plans_in(layout)})
        failed = threading.Event()  # after one matrix fails, the others are not read: the model is done

        def sketch(ref: MatrixRef) -> tuple[tuple[torch.Tensor, torch.Tensor], RowStats] | None:
            if failed.is_set():
                return None
            try:
                rows = self._level_rows(ck, layout, ref)
                return self._raw_sketch(ck, layout, ref), row_stats(rows, self.base_rows_[ref.key])
            except BaseException:
                failed.set()
                raise

        done = self._map(sketch, layout.refs)
        raw = {ref.key: d[0][0] for ref, d in zip(layout.refs, done) if d is not None}
        traw = {ref.key: d[0][1] for ref, d in zip(layout.refs, done) if d is not None}
        return raw, traw, sum((d[1] for d in done if d is not None), RowStats())

    def _sketched(self, raw: dict[tuple[str, int, str], torch.Tensor]) -> np.ndarray:
        """The vector of raw blocks: each normalised in float64, rounded once to float32, then pooled."""
        norm = self.representation.block_norm
        blocks = {
            key: (normalise_blocks(b.reshape(1, -1))[0] if norm else b.reshape(-1)).float() for key, b in raw.items()
        }
        return self._pooled(self.layout_, lambda refs: [blocks[r.key] for r in refs])

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

    def _pooled(self, layout: Layout, factors_of: Callable[[list[MatrixRef]], list[torch.Tensor]]) -> np.ndarray:
        """The vector: each layer's factors concatenated, layers pooled, stacks concatenated.

        Every block is computed in float64 (the SVD factors kept so, the sketch's rounded to float32 after its
        norm) and layers are summed in float64, the vector rounded to float32 at the end: the same key gives
        the same vector on any device, whatever its order of summation, to that rounding.
        """
        stacks: dict[str, list[torch.Tensor]] = {}
        counts: dict[str, int] = {}
        for stack, _layer, refs in layout.by_layer():
            layer_vec = torch.cat(factors_of(refs))
            if self.representation.pooling == "mean":
                acc = stacks.setdefault(stack, [torch.zeros_like(layer_vec, dtype=torch.float64)])
                acc[0] += layer_vec
                counts[stack] = counts.get(stack, 0) + 1
            else:  # nothing is summed: rounded now, the same rounding as at the end
                stacks.setdefault(stack, []).append(layer_vec.float())
        parts = [
            acc[0] / counts[name] if self.representation.pooling == "mean" else torch.cat(acc)
            for name, acc in stacks.items()
        ]
        return torch.cat(parts).to("cpu", torch.float32).numpy()

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

    def _adapter_raw(self, ck: Checkpoint) -> tuple[_Blocks, _Blocks]:
        """Every matrix's raw sketch (float64) from an adapter's dW = L R^T: L (R^T Omega), never the n x m delta, and
        its trace's (the same where the vector's is the delta's own sketch); a matrix the adapter leaves alone is a
        zero block, as a merged model's would be."""
        shapes = dict(self.shapes_)
        deltas = ck.low_rank_deltas(self.layout_, shapes)
        raw: _Blocks = {}
        traw: _Blocks = {}
        for ref in self.layout_.refs:
            delta = deltas.get(ref.key)
            if delta is None:
                raw[ref.key] = torch.zeros(self.representation.plan_floats(self.plans_[ref.key]), dtype=torch.float64)
                traw[ref.key] = raw[ref.key]
                continue
            # dW = L R^T (n x m); stored as R L^T (nn.Linear) or L R^T (Conv1D): rows first
            linear = ref.orientation is Orientation.LINEAR
            rows, cols = (delta.right, delta.left) if linear else (delta.left, delta.right)
            step = max(1, _CHUNK_BYTES // (8 * cols.shape[0]))
            raw[ref.key] = self.projections_[ref.key].of_factors(rows, cols, step).cpu()
            tracing = self.trace_projections_[ref.key]
            same = tracing is self.projections_[ref.key]
            traw[ref.key] = raw[ref.key] if same else tracing.of_factors(rows, cols, step).cpu()
        return raw, traw

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

    def _map(self, fn: Callable[[MatrixRef], Any], refs: Sequence[MatrixRef]) -> list[Any]:
        """``fn`` over the matrices: on the CPU spread over the sketch threads, on a GPU in order (one stream)."""
        if self.device.type == "cpu":
            return list(self._pool().map(fn, refs))
        return [fn(ref) for ref in refs]

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
            k: v
            for k, v in self.__dict__.items()
            if k not in ("_threads", "_buffers", "_chunks", "_smaller_embedder", "_parents")
        }

    def _plans_in(self, layout: Layout) -> list[MatrixPlan]:
        """The base's plans with a fine-tune's own name prefix (the rows and columns are the base's)."""
        if layout.prefix == self.layout_.prefix:
            return list(self.plans_.values())
        cut = len(self.layout_.prefix)
        return [replace(p, tensor=layout.prefix + p.tensor[cut:]) for p in self.plans_.values()]

    def _project(self, ck: Checkpoint, layout: Layout, ref: MatrixRef) -> tuple[torch.Tensor, torch.Tensor]:
        """The projection of one matrix of ``ck`` (its rows that the plan selects), float64 on the device, and its
        trace's (the same tensor where the vector's is the delta's own sketch).

        The stored tensor is a view of the mapped file in its stored dtype; only the selected rows
        are touched, in cache-sized chunks converted to float64 and projected while in cache (on a
        GPU, copied as stored and converted there). float64 so that the fine-tune's and the base's
        blocks can be subtracted: on bf16 Llama-shaped matrices the difference is 1e-14 from a
        float64 reference, where the delta formed first and multiplied in float32 is 2e-7 from it
        (and float32 sketches subtracted, 2e-5); see docs/scale.md.
        """
        plan, projection, tracing = self.plans_[ref.key], self.projections_[ref.key], self.trace_projections_[ref.key]
        separate = tracing is not projection
        name = layout.prefix + ref.tensor
        stored = ck.get_stored(name, whole=False)  # require_rows checked the rows read below
        if stored.ndim != 2:
            raise CheckpointError(ck.name, f"tensor {name} has shape {list(stored.shape)}, expected a matrix")
        if tuple(stored.shape) != self.stored_shapes_[ref.tensor]:
            base_stored = list(self.stored_shapes_[ref.tensor])
            raise IncompatibleError(
                ck.name, f"tensor {name} has shape {list(stored.shape)}, the base's has {base_stored}"
            )
        c0, c1 = plan.cols
        step = max(1, _CHUNK_BYTES // (8 * (c1 - c0)))
        acc = projection.start()
        tacc = tracing.start() if separate else acc
        first = 0
        for a, b in plan.row_ranges:
            for start in range(a, b, step):
                stop = min(b, start + step)
                part = stored[start:stop, c0:c1]
                if self.device.type == "cpu":
                    chunk = self._chunk((stop - start, c1 - c0))
                    chunk.copy_(part)
                else:
                    chunk = self._to_device(part).double()
                projection.add(acc, chunk, first)  # the probe's first: the CountSketch scales the chunk in place
                if separate:
                    tracing.add(tacc, chunk, first)
                first += stop - start
        out = projection.finish(acc)
        return out, tracing.finish(tacc) if separate else out

    def _raw_sketch(self, ck: Checkpoint, layout: Layout, ref: MatrixRef) -> tuple[torch.Tensor, torch.Tensor]:
        """One matrix's raw sketch (float64, on the CPU): the fine-tune's projection minus the base's, made at fit;
        and its trace's (the same tensor where the vector's is the delta's own sketch).

        Only the fine-tune is read: half the bytes of forming the delta. A matrix the fine-tune
        left alone gives exactly zero (the same float64 computation on the same bytes).
        """
        sketched, traced = self._project(ck, layout, ref)
        out = sketched - self.base_sketches_[ref.key]
        trace = out if traced is sketched else traced - self.base_traces_[ref.key]
        if not bool(torch.isfinite(out).all() and torch.isfinite(trace).all()):
            raise CheckpointError(ck.name, f"tensor {layout.prefix + ref.tensor} has NaN or Inf values")
        flat = out.reshape(-1).cpu()
        return flat, flat if trace is out else trace.reshape(-1).cpu()

    def _level_rows(self, ck: Checkpoint, layout: Layout, ref: MatrixRef) -> torch.Tensor:
        """``ck``'s first stored rows read of one matrix, as stored: what its trace's row statistics are counted on
        (see :mod:`.trace`)."""
        plan = self.plans_[ref.key]
        stored = ck.get_stored(layout.prefix + ref.tensor, whole=False)
        a, b = plan.row_ranges[0]
        c0, c1 = plan.cols
        return stored[a : min(b, a + LEVEL_ROWS), c0:c1]

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

    def _to_device(self, stored: torch.Tensor) -> torch.Tensor:
        """A stored matrix on the device in its stored dtype; to a GPU through pinned memory, without blocking."""
        if self.device.type == "cpu":
            return stored
        return stored.contiguous().pin_memory().to(self.device, non_blocking=True)

    def _buffer(self, shape: tuple[int, ...]) -> torch.Tensor:
        """A reused scratch buffer per shape: fresh large allocations page-fault on every model."""
        buffers = self.__dict__.setdefault("_buffers", {})
        if shape not in buffers:
            buffers[shape] = torch.empty(shape, device=self.device)
        return buffers[shape]

    def _chunk(self, shape: tuple[int, int]) -> torch.Tensor:
        """A float64 chunk buffer of the calling thread (each sketch thread streams its own matrix)."""
        local = self.__dict__.setdefault("_chunks", threading.local())
        buffers = local.__dict__.setdefault("buffers", {})
        if shape not in buffers:
            buffers[shape] = torch.empty(shape, dtype=torch.float64)
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
        if not hasattr(self, "shapes_"):
            raise RuntimeError("call fit(base) before transform")
