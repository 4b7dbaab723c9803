"""What a fitted :class:`~modelvec.represent.embedder.DeltaEmbedder` holds, and what the parts of its work share
(its sketch: :mod:`.sketching`; its SVD factors: :mod:`.factors`)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from ..read import Checkpoint, Layout, MatrixRef
from .plans import MatrixPlan
from .probe import ProbeInputs
from .projection import AnyProjection
from .representation import Representation
from .trace import Tracer
from .vocabulary import VocabularyReadout

Key = tuple[str, int, str]  # a matrix: (stack, layer, family)
Blocks = dict[Key, torch.Tensor]  # a model's raw blocks, by matrix


class EmbedderParts:
    """What a fitted :class:`~modelvec.represent.embedder.DeltaEmbedder` holds, declared once for the parts of its
    work kept in their own modules, and the helpers they share: the device, scratch buffers, the sketch threads,
    and the pooling of blocks into a vector."""

    representation: Representation
    device: torch.device
    batching: str
    base_: Checkpoint
    layout_: Layout
    shapes_: dict[Key, tuple[int, int]]
    families_: dict[tuple, list[MatrixRef]]
    plans_: dict[Key, MatrixPlan]
    stored_shapes_: dict[str, tuple[int, ...]]
    vocabulary_: VocabularyReadout | None
    projections_: dict[Key, AnyProjection]
    trace_projections_: dict[Key, AnyProjection]
    base_sketches_: Blocks
    base_traces_: Blocks
    tracer_: Tracer
    base_scale_: float
    base_rows_: dict[Key, torch.Tensor]
    entry_positions_: dict[Key, np.ndarray]  # the entries of base_rows_ whose delta a trace keeps
    rows_: dict[str, tuple[tuple[int, int], ...]]  # the stored rows the base's plan reads, by tensor
    inputs_: ProbeInputs

    @property
    def by_family(self) -> bool:
        """Whether deltas are batched per family across layers (see the class docstring)."""
        return self.batching == "family" or (self.batching == "auto" and self.device.type != "cpu")

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
