"""What both ways of answering ``neighbors`` share: the answer (:class:`Neighbors`), the query embedded on the fly,
why the base has no neighbours, a stored model's place in the tree and the blocks that carry a similarity."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ..analyse.scores import cosine_contributions
from ..core.errors import ModelvecError, NothingStoredError
from ..core.names import is_hub_id, model_id
from ..represent.representation import Representation
from ..store import Population, Store

if TYPE_CHECKING:
    from ..hub.client import HubSettings

PathLike = str | os.PathLike[str]


@dataclass(kw_only=True)
class Neighbors:
    """The stored models nearest to a query model, and the dataset their labels suggest for it."""

    query: str
    base: str
    params: str
    on_the_fly: bool  # the query was not in the store: embedded now with the stored settings, not stored
    nearest: pd.DataFrame  # model, distance, datasets, label_source, author; nearest first
    predicted: str | None  # the majority dataset of the k nearest labelled models (None: none labelled)
    confidence: float  # vote_share x closeness; nan when nothing was predicted
    votes: dict[str, int] = field(default_factory=dict)
    vote_share: float = float("nan")  # the predicted dataset's share of the votes
    #: how near the nearest labelled model is (1: as near as stored models are to theirs; 0: as far as unrelated ones)
    closeness: float = float("nan")
    warning: str | None = None  # e.g. the query was embedded against another revision of the base
    #: with ``explain``: per neighbour, its cosine and each block's share of it (stack, layer, family)
    explanation: list[dict[str, Any]] | None = None
    voters: int = 0  # how many labelled models voted: the k nearest, or all of them when fewer
    scaling: str = "none"  # how the stored models were ranked (``auto`` resolved)
    scaling_note: str | None = None  # why, when ``auto`` chose it
    #: stored vectors left out because their bytes do not match their checksum: model -> one line
    damaged: dict[str, str] = field(default_factory=dict)
    #: a stored query's place in the model tree (``modelvec tree``): its kind, parent(s), confidence, declared; None
    #: for a model embedded now or a store without traces
    tree: dict[str, Any] | None = None
    #: what the stored population left out and why (stale vectors, copies of the base): one line each
    notes: list[str] = field(default_factory=list)
    #: kept files that did not verify and were computed again: one line each (said on stderr, not part of the answer)
    repaired: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        """Everything above but ``repaired``, the neighbours as records (nearest first)."""
        out = {k: v for k, v in self.__dict__.items() if k not in ("nearest", "repaired")}
        out["nearest"] = json.loads(self.nearest.to_json(orient="records"))
        return out


def embed_query(
    model: PathLike | str, pop: Population, hub_settings: HubSettings | None
) -> tuple[np.ndarray, str | None, bool | None]:
    """Embed a model that is not stored, in a scratch store, exactly as ``embed`` would store it: its vector, a
    warning when the base changed since the stored vectors were embedded against it, and whether it is an adapter.

    The scratch store gets the population's version of the base (a Hub base's revision, a local base's recorded
    identity) and the model's catalogue entry, so the base resolves to the version the stored vectors were computed
    against, and a local base unchanged since is not hashed again.
    """
    from ..run import catalogue_entries, embed  # torch, only to embed a model that is not stored

    name, base, db = model_id(model), pop.name, pop.db
    with tempfile.TemporaryDirectory(prefix="modelvec-query-") as tmp, Store(Path(tmp) / "query.duckdb") as scratch:
        if pop.base_hash.startswith("git:"):
            entries = catalogue_entries(db, base, kept=None, model=name) if is_hub_id(name) else []
            scratch.writes.put_catalogue(base, pop.base_hash.removeprefix("git:"), entries)
        for stamp in db.versions.stamps(base, pop.base_hash):
            scratch.versions.record_base(base, stamp, pop.base_hash)
        result = embed(
            base, [model], representation=pop.representation, store=scratch, hub_settings=hub_settings, workers=1
        )
        if result.failed:
            name, why = next(iter(result.failed.items()))
            raise ModelvecError(name, why.removeprefix(f"{name}: "))
        base_hash = scratch.versions.base_hashes(base, pop.representation)
    warning = None
    if base_hash and base_hash[0] != pop.base_hash:
        warning = (
            f"{name} was embedded against {base} as it is now ({base_hash[0]}), but the stored vectors "
            f"were computed against {pop.base_hash}: distances may include the base's change"
        )
    kind = result.metadata["adapter"].iloc[0]
    return result.vectors[0], warning, None if pd.isna(kind) else bool(kind)


#: Why the base itself, and a model whose weights are the base's, has no neighbours: every vector is a delta from the
#: base, so theirs is zero, at the same distance from every stored model.
IS_THE_BASE = (
    "it is the base of the stored models: its vector is zero (the vectors are deltas from the base), so it has no "
    "neighbours; ask about one of its fine-tunes"
)
IS_A_COPY = (
    "its weights are the base's (a copy of the base): its vector is zero (the vectors are deltas from the base), so "
    "it is not on the map and has no neighbours"
)


def place_of(pop: Population, model: str) -> dict[str, Any] | None:
    """A stored model's node of the model tree, None without traces: from the tree kept beside the store where the
    traces' rows name it (at any size: no trace is read), else the whole tree inferred and kept."""
    from .tree import tree_of

    try:
        tree = tree_of(pop, verify=False)
    except NothingStoredError:
        return None
    node = tree.by_model().get(model)
    return node.as_json() if node is not None else None


def explain_of(
    query: np.ndarray, rows: np.ndarray, models: pd.Series, base: str, representation: Representation
) -> list[dict[str, Any]]:
    from ..represent import blocks_of

    blocks = blocks_of(base, representation)
    shares = cosine_contributions(query, rows, [(b.start, b.stop) for b in blocks])
    out = []
    for model, row in zip(models, shares):
        by_family: dict[str, float] = {}
        by_layer: dict[str, float] = {}
        for b, v in zip(blocks, row):
            by_family[b.family] = by_family.get(b.family, 0.0) + float(v)
            if b.layer is not None:
                key = f"{b.stack} {b.layer}"
                by_layer[key] = by_layer.get(key, 0.0) + float(v)
        parts = [
            {"stack": b.stack, "layer": b.layer, "family": b.family, "share": float(v)} for b, v in zip(blocks, row)
        ]
        parts.sort(key=lambda p: -abs(float(p["share"])))  # type: ignore[arg-type]
        out.append(
            {"model": model, "cosine": float(row.sum()), "by_family": by_family, "by_layer": by_layer, "blocks": parts}
        )
    return out
