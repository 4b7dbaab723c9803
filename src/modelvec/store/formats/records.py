"""What the store holds, as records: a computed vector with what is known about its model, or a failure.

Each record type says which column of its table (:mod:`modelvec.store.formats.schema`) holds which of its fields, so the
writer's INSERT is made from the table and the row, never spelt out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...analyse.tree.copies import mini_of
from ...core.errors import Kind
from ...represent.representation import Representation
from ...represent.trace import Trace


@dataclass
class VectorRow:
    """One computed vector with what is known about its model."""

    model: str
    model_version: str  # stored as model_hash: a Hub model's git:<sha>, a local one's files' stamp
    base: str
    base_version: str  # stored as base_hash: a Hub base's git:<sha>, a local one's content fingerprint
    representation: Representation
    architecture: str
    vector: np.ndarray
    datasets: list[str]
    source: str
    seconds: float
    label_source: str | None = None  # where the dataset labels came from, e.g. "card"
    author: str | None = None
    adapter: bool | None = None  # a LoRA adapter rather than a full fine-tune (None: not known)
    quantized: str | None = None  # the block-quantized types of its weights (a GGUF's Q4_K...): no point on the map
    trace: Trace | None = None  # what the model tree is inferred from (None: not the sketch)
    parent: str | None = None  # the fine-tune an adapter was embedded on (None: the base)
    card_hash: str | None = None  # an xxh3 of the model card's bytes (None: no card read)
    relation: str | None = None  # what the card declares: its relation to its parents (None: nothing)
    parents: list[str] | None = None  # the parents the card names (``base_model``)
    created: str | None = None  # when the model was made (ISO): the Hub's date, or its files' oldest time
    files_id: str | None = None  # a local model's weight files as resolved paths: the same files are one model

    def trace_record(self, offset: int, sketch_hash: str, entries: tuple[int, str] | None = None) -> dict[str, Any]:
        """The ``traces`` columns of this row, its sketch's bytes at ``offset`` of the vector file (``entries``: its
        kept entries' offset and checksum, where it keeps them)."""
        assert self.trace is not None
        return trace_record(
            self.model,
            self.base,
            self.base_version,
            self.representation,
            self.trace,
            offset,
            sketch_hash,
            self.parent,
            entries,
        )

    def record(self, offset: int, vector_hash: str) -> dict[str, Any]:
        """The ``vectors`` columns of this row, its bytes at ``offset`` of the vector file with checksum ``vector_hash``."""
        p = self.representation
        return {
            "model": self.model,
            "model_hash": self.model_version,
            "base": self.base,
            "base_hash": self.base_version,
            "params": p.key(),
            "rank": p.rank,
            "factor": p.factor,
            "pooling": p.pooling,
            "solver": p.solver,
            "sign": p.sign,
            "params_json": json.dumps(p.as_dict(), sort_keys=True),
            "architecture": self.architecture,
            "dim": int(np.size(self.vector)),
            "offset": offset,
            "vector_hash": vector_hash,
            "datasets": list(self.datasets),
            "label_source": self.label_source,
            "author": self.author,
            "source": self.source,
            "seconds": float(self.seconds),
            "adapter": self.adapter,
            "quantized": self.quantized,
            "card_hash": self.card_hash,
            "relation": self.relation,
            "parents": self.parents,
            "created": self.created,
            "files_id": self.files_id,
        }


def trace_record(
    model: str,
    base: str,
    base_hash: str,
    representation: Representation,
    trace: Trace,
    offset: int,
    sketch_hash: str,
    parent: str | None = None,
    entries: tuple[int, str] | None = None,
) -> dict[str, Any]:
    """One ``traces`` row: a model's trace, its sketch's bytes at ``offset`` of the vector file; ``entries``: the
    offset and checksum of its :func:`entry_vector` there (None: it keeps none)."""
    kept = entry_vector(trace)
    return {
        "model": model,
        "base": base,
        "base_hash": base_hash,
        "params": representation.key(),
        "offset": offset,
        "dim": int(np.size(trace.sketch)),
        "sketch_hash": sketch_hash,
        "levels": trace.levels,
        "scale": float(trace.scale),
        "zeros": trace.zeros,
        "along": trace.along,
        "zeros_bf16": trace.zeros_bf16,
        "precision": trace.precision,
        "rounding": trace.rounding,
        "norm": float(np.linalg.norm(np.asarray(trace.sketch, np.float32).astype(np.float64))),  # as stored
        "mini": mini_of(np.asarray(trace.sketch, np.float32)).tolist(),
        "parent": parent,
        "entries_offset": entries[0] if entries is not None and kept is not None else None,
        "entries_dim": len(kept) if entries is not None and kept is not None else None,
        "entries_hash": entries[1] if entries is not None and kept is not None else None,
    }


def entry_vector(trace: Trace) -> np.ndarray | None:
    """What the vector file holds of a trace's kept entries: the delta's, then the base's weights there (float32);
    None where it keeps none."""
    if trace.entries is None or trace.base_entries is None:
        return None
    return np.concatenate([trace.entries, trace.base_entries]).astype(np.float32)


@dataclass
class Failure:
    """Why one model could not be embedded, and the failure's kind.

    A ``content`` failure with its ``model_version`` is skipped by later runs while the weights are
    unchanged; ``resource`` and ``transient`` failures are shown but tried again.
    """

    model: str
    base: str
    representation: Representation
    error: str
    model_version: str | None = None  # stored as model_hash
    kind: Kind | str = Kind.CONTENT

    def record(self) -> dict[str, Any]:
        """The ``failures`` columns of this row."""
        return {
            "model": self.model,
            "base": self.base,
            "params": self.representation.key(),
            "error": self.error,
            "model_hash": self.model_version,
            "kind": Kind(self.kind).value,
        }


@dataclass
class CardUpdate:
    """A stored model's card read again (it changed since): its labels and declarations replace the stored ones in
    every row of the model for that base, its vector untouched; ``model_version``: its new version where a new
    commit left its weights as they were (None: unchanged)."""

    model: str
    base: str
    card_hash: str | None
    datasets: list[str]
    label_source: str | None
    author: str | None
    relation: str | None
    parents: list[str] | None
    model_version: str | None = None
    old_version: str | None = None  # the version whose rows take ``model_version``

    def assignments(self) -> dict[str, Any]:
        """The ``vectors`` columns it sets."""
        out = {
            "card_hash": self.card_hash,
            "datasets": list(self.datasets),
            "label_source": self.label_source,
            "author": self.author,
            "relation": self.relation,
            "parents": self.parents,
        }
        return out | ({"model_hash": self.model_version} if self.model_version is not None else {})


@dataclass
class Alias:
    """A second name of a stored model (the same weight files given another way): one model, stored once."""

    base: str
    alias: str
    model: str

    def record(self) -> dict[str, Any]:
        return {"base": self.base, "alias": self.alias, "model": self.model}
