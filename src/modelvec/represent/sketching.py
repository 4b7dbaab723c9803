"""The sketch of a model's delta, read from the rows its plan selects: the default representation's blocks, an
adapter's (from its factors, on its parent's delta where it was trained on a fine-tune), and its trace's."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import torch

from ..core.errors import CheckpointError, IncompatibleError
from ..read import Checkpoint, Layout, MatrixRef, Orientation, check_compatible, open_checkpoint
from .linalg import normalise_blocks
from .probe import ProbeInputs, compute_inputs
from .projection import AnyProjection, ProbeProjection, Projection, TopProjection
from .state import Blocks, EmbedderParts
from .trace import LEVEL_ROWS, RowStats, Trace, row_stats

_CHUNK_BYTES = 2 << 20  # a delta chunk that stays in cache (L3) between the subtraction and the product
#: Parents (fine-tunes that adapters were trained on) whose raw blocks an embedder keeps, the most recently used: an
#: 8B parent's are ~26 MB under the default size budget (100,000 floats a layer, float64: a sum of float64 blocks is
#: what gives an adapter the bits of its merged model).
PARENTS_KEPT = 4
_PARENTS_LOCK = threading.Lock()  # guards every embedder's kept parents (never pickled: module state)


@dataclass(frozen=True)
class Parent:
    """An adapter's parent fine-tune as a run knows it: ``version``, what the weights are named by (a Hub commit, its
    files' stamp), which its read rows are kept by for its other adapters; ``open``, how to open it, called only
    where they are not kept. The embedder closes what ``open`` gives."""

    version: str
    open: Callable[[], Checkpoint]


@dataclass(frozen=True)
class _ParentRows:
    """What an adapter needs of its parent, read once: each matrix's raw sketch block (float64), its trace's (the same
    where the vector's is the delta's own sketch) and its head's beta (None: it has no vocabulary head, or none is
    read)."""

    raw: dict[tuple[str, int, str], torch.Tensor]
    traw: dict[tuple[str, int, str], torch.Tensor]
    beta: torch.Tensor | None


class Sketching(EmbedderParts):
    """The sketch (the default representation): each matrix's selected rows projected, the base's projection made
    once at fit and subtracted in float64; an adapter's from its factors, on its parent's delta where it has one."""

    def _projections(
        self, ck: Checkpoint, layout: Layout, inputs: ProbeInputs | None
    ) -> dict[tuple[str, int, str], AnyProjection]:
        """Each matrix's fixed map to its block: a random projection of its delta, or of its delta through the
        base's inputs (``probe``: ``inputs``, computed from the base's folder where not given)."""
        rep = self.representation
        tokens = rep.probe_tokens(layout.arch.probe)
        if tokens is None and not rep.truncates:
            omegas: dict[int, torch.Tensor] = {}  # the shared projection's Omega^T, one per width
            return {
                ref.key: Projection(self.plans_[ref.key], rep, (ref.stack, ref.layer, ref.family), self.device, omegas)
                for ref in layout.refs
            }
        h: dict[str, torch.Tensor] = {}  # each matrix's inputs (by tensor); none: TopProjection's seeded Gaussian
        if tokens is not None:
            if inputs is None:
                inputs = compute_inputs(ck.path if ck.path.is_dir() else ck.path.parent, layout, tokens, ck.name)
            if inputs.tokens != tokens or any(ref.tensor not in inputs.of for ref in layout.refs):
                raise ValueError(f"the probe inputs given are not {ck.name}'s on {tokens} tokens")
            self.inputs_ = inputs
            arrays = {
                name: torch.from_numpy(np.array(a, np.float64)).to(self.device) for name, a in inputs.arrays.items()
            }
            h = {ref.tensor: arrays[inputs.of[ref.tensor]] for ref in layout.refs}
        through = TopProjection if rep.truncates else ProbeProjection
        return {
            ref.key: through(
                self.plans_[ref.key], rep, (ref.stack, ref.layer, ref.family), self.device, h.get(ref.tensor)
            )
            for ref in layout.refs
        }

    def _trace_projections(self, layout: Layout) -> dict[tuple[str, int, str], AnyProjection]:
        """What the traces sketch: the delta's own CountSketch (the tree's evidence was measured on it), the vector's
        projections where they are that already; a second map of the same rows where the vector's go through the
        probe or are kept at their top directions."""
        rep = self.representation
        if rep.probe_tokens(layout.arch.probe) is None and not rep.truncates:
            return self.projections_
        plain = replace(self.representation, probe="none", delta_rank="none")
        return {
            ref.key: Projection(self.plans_[ref.key], plain, (ref.stack, ref.layer, ref.family), self.device)
            for ref in layout.refs
        }

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

    def _raw_blocks(self, ck: Checkpoint) -> tuple[Blocks, Blocks, RowStats | None]:
        """The sketch's raw blocks of ``ck``'s delta (float64, before their norm), its trace's (the same where the
        vector's are the delta's own sketch), and what its first rows read say beside the base's (None for an
        adapter: see :mod:`~modelvec.represent.trace`)."""
        if ck.factored:  # a LoRA adapter: its delta comes as thin factors
            return *self._adapter_raw(ck), None
        layout = ck.layout()
        check_compatible(ck, layout, self.layout_)
        ck.require_rows(self._rows_in(layout))  # within the plan it was fetched by: its byte ranges not again
        failed = threading.Event()  # after one matrix fails, the others are not read: the model is done

        def sketch(ref: MatrixRef) -> tuple[tuple[torch.Tensor, torch.Tensor], RowStats] | None:
            if failed.is_set():
                return None
            try:
                rows = self._level_rows(ck, layout, ref)
                entries = self.__dict__.get("entry_positions_", {}).get(ref.key)  # None: an embedder fitted before
                return self._raw_sketch(ck, layout, ref), row_stats(rows, self.base_rows_[ref.key], entries)
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
        final = {key: self.projections_[key].final(b) for key, b in raw.items()}  # a truncation's SVD, where it has one
        blocks = {
            key: (normalise_blocks(b.reshape(1, -1))[0] if norm else b.reshape(-1)).float() for key, b in final.items()
        }
        return self._pooled(self.layout_, lambda refs: [blocks[r.key] for r in refs])

    def _adapter_raw(self, ck: Checkpoint) -> tuple[Blocks, Blocks]:
        """Every matrix's raw sketch (float64) from an adapter's dW = L R^T: L (R^T Omega), never the n x m delta, and
        its trace's (the same where the vector's is the delta's own sketch); a matrix the adapter leaves alone is a
        zero block, as a merged model's would be."""
        shapes = dict(self.shapes_)
        deltas = ck.low_rank_deltas(self.layout_, shapes)
        raw: Blocks = {}
        traw: Blocks = {}
        for ref in self.layout_.refs:
            delta = deltas.get(ref.key)
            if delta is None:
                raw[ref.key] = torch.zeros(self.projections_[ref.key].raw_size, dtype=torch.float64)
                tracing = self.trace_projections_[ref.key]
                same = tracing is self.projections_[ref.key]
                traw[ref.key] = raw[ref.key] if same else torch.zeros(tracing.raw_size, dtype=torch.float64)
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

    def _rows_in(self, layout: Layout) -> dict[str, tuple[tuple[int, int], ...]]:
        """The rows the base's plan reads (:attr:`rows_`, worked out at fit), under a fine-tune's own name prefix."""
        if layout.prefix == self.layout_.prefix:
            return self.rows_
        cut = len(self.layout_.prefix)
        return {layout.prefix + tensor[cut:]: rows for tensor, rows in self.rows_.items()}

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
