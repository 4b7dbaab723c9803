"""Which stored models are like mine? The nearest stored models to any model, and the dataset they suggest.

A model that is not in the store (a local folder, a LoRA adapter or a Hub id) is embedded on the fly
with the stored representation against the stored base, compared, and not stored.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ..analyse.scores import (
    NEIGHBORS_SCORING,
    Geometry,
    Scoring,
    cosine_contributions,
    majority_dataset,
    nearest_to,
    query_distances,
    yardstick,
)
from ..core.errors import ModelvecError, NothingStoredError, StoreError
from ..core.names import is_hub_id, model_id
from ..core.settings import with_options
from ..represent.representation import Representation
from ..store import Products, Selection, Store, opened
from .stored import kept_spread, products_key, stored_base, stored_products

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

    def as_json(self) -> dict[str, Any]:
        """Everything above, the neighbours as records (nearest first)."""
        out = {k: v for k, v in self.__dict__.items() if k != "nearest"}
        out["nearest"] = json.loads(self.nearest.to_json(orient="records"))
        return out


def _embed_query(
    model: PathLike | str, base: str, representation: Representation, db: Store, hub_settings: HubSettings | None
) -> tuple[np.ndarray, str | None, bool | None]:
    """Embed a model that is not stored, in a scratch store, exactly as ``embed`` would store it: its vector, a
    warning when the base changed since, and whether it is an adapter.

    The scratch store gets the stored base revision and the model's catalogue entry, so a Hub
    base resolves to the revision the stored vectors were computed against.
    """
    from ..run import catalogue_entries, embed  # torch, only to embed a model that is not stored

    name = model_id(model)
    with tempfile.TemporaryDirectory(prefix="modelvec-query-") as tmp, Store(Path(tmp) / "query.duckdb") as scratch:
        sha = db.base_sha(base)
        if sha is not None:
            scratch.put_catalogue(
                base, sha, catalogue_entries(db, base, kept=None, model=name) if is_hub_id(name) else []
            )
        result = embed(
            base, [model], representation=representation, store=scratch, hub_settings=hub_settings, workers=1
        )
        if result.failed:
            name, why = next(iter(result.failed.items()))
            raise ModelvecError(name, why.removeprefix(f"{name}: "))
        base_hash = scratch.base_hashes(base, representation)
    stored = db.base_hashes(base, representation)
    warning = None
    if base_hash and stored and base_hash[0] not in stored:
        warning = (
            f"{name} was embedded against {base} as it is now ({base_hash[0]}), but the stored vectors "
            f"were computed against {', '.join(stored)}: distances may include the base's change"
        )
    kind = result.metadata["adapter"].iloc[0]
    return result.vectors[0], warning, None if pd.isna(kind) else bool(kind)


def neighbors(
    model: PathLike | str,
    *,
    representation: Representation | None = None,
    scoring: Scoring | None = None,
    store: Store | PathLike | None = None,
    base: PathLike | str | None = None,
    hub_settings: HubSettings | None = None,
    explain: bool = False,
    **options: Any,
) -> Neighbors:
    """The ``scoring.k`` stored models nearest to ``model``, and the dataset they suggest for it.

    ``model`` is a stored model, or any local folder or Hub id: one not in the store is embedded on the fly with
    ``representation`` against the stored base (``base``, or the only one stored) and compared, not stored. The
    prediction is the majority dataset of the ``k`` nearest labelled models (as ``cluster`` predicts), with its vote
    share; a stored model's place in the model tree is ``tree``. ``explain`` adds, per neighbour, which layers and
    families carry the similarity: each block's share of the cosine (:func:`~modelvec.analyse.scores.cosine_contributions`).
    ``scoring`` (default :data:`~modelvec.analyse.scores.NEIGHBORS_SCORING`): its ``metric``, and its ``scaling``: ``"mutual-proximity"``
    ranks the stored models by mutual proximity (distance: -log MP), ``"auto"`` (the default) does so where they
    and the query mix LoRA adapters and full fine-tunes. Its settings may also be given one by one (``k=5``).
    """
    representation = representation or Representation()
    scoring = with_options(Scoring, scoring, options, "neighbors", default=NEIGHBORS_SCORING)
    k, metric = scoring.k, scoring.metric
    with opened(store, read_only=True) as db:
        name = model_id(model) if os.path.exists(str(model)) else str(model)
        own = db.metadata(representation=representation, models=[name])
        if base is not None or own.empty:
            base_name = stored_base(db, base, representation)
            own = own[own["base"] == base_name]
        else:
            base_name = own["base"].iloc[0]
        selection, meta = db.select(base=base_name, representation=representation)
        # kept products are trusted here (cluster reads every vector): a query reads only what it needs
        products, meta = stored_products(db, selection, meta, products_key(base_name, representation), verify=False)
        query = _Query(name, model, own.empty, meta, base_name, representation, db, hub_settings, products)
        scaling, scaling_note = scoring.scaling_for(query.kinds)
        geo = Geometry.from_products(products.gram, metric)
        key = products_key(base_name, representation)
        kept_spread(db, [selection.hashes[i] for i in products.kept], key, geo, scaling)
        distances, first_dot = query.distances(db, selection, geo, metric)
        order, dist_all = nearest_to(geo, distances, k=len(meta), exclude=query.me, scaling=scaling)
        idx = order[:k]
        neighbours = (query.vector(db, selection), _read(db, selection, products.kept[idx])) if explain else None
        base_files = _local_files(base_name, db, hub_settings) if explain else None
        place = None if query.on_the_fly else _place(db, base_name, name, representation)
    found = meta.iloc[idx][["model", "datasets", "label_source", "author"]].reset_index(drop=True)
    found.insert(1, "distance", dist_all[:k])
    labels = [list(d) for d in meta["datasets"]]
    voters = [i for i in order.tolist() if labels[i]][:k]  # the k nearest labelled models, in the same order
    predicted, share, near = None, float("nan"), float("nan")
    votes: dict[str, int] = {}
    if voters:
        predicted, share, votes = majority_dataset([labels[i] for i in voters])
        ruler = yardstick(geo, labels, metric=metric, scaling=scaling, exclude=query.me)  # not its own ruler
        near = ruler.closeness(float(dist_all[order == voters[0]][0]), shares_direction=first_dot(voters[0]) > 0)
    explanation = (
        _explain(*neighbours, found["model"], base_files, representation)
        if base_files is not None and neighbours is not None
        else None
    )
    return Neighbors(
        query=name,
        base=base_name,
        params=representation.key(),
        on_the_fly=query.on_the_fly,
        nearest=found,
        predicted=predicted,
        confidence=share * near,
        votes=votes,
        vote_share=share,
        closeness=near,
        warning=query.warning,
        explanation=explanation,
        voters=len(voters),
        scaling=scaling,
        scaling_note=scaling_note,
        damaged=products.damaged,
        tree=place,
    )


#: Stored models up to which a neighbour query also names the model's parent and kind (a pass over every stored trace,
#: 64 KB each: 1.3 s of a 3.3 s query at 4,000 models); above, ``modelvec tree`` does.
PLACE_UP_TO = 2000


def _place(db: Store, base: str, model: str, representation: Representation) -> dict[str, Any] | None:
    """A stored model's node of the model tree (one pass over the stored traces), None without traces or above
    :data:`PLACE_UP_TO` stored models."""
    from .tree import model_tree

    if db.count_traces(base, representation.key()) > PLACE_UP_TO:
        return None
    try:
        tree = model_tree(base, representation=representation, store=db, only=[model])
    except NothingStoredError:
        return None
    return tree.nodes[0].as_json() if tree.nodes else None


class _Query:
    """The model asked about: a stored one (its row ``me``), or one embedded now (its vector, compared with the
    stored ones in one pass over them)."""

    def __init__(
        self,
        name: str,
        model: PathLike | str,
        on_the_fly: bool,
        meta: pd.DataFrame,
        base: str,
        representation: Representation,
        db: Store,
        hub_settings: HubSettings | None,
        products: Products,
    ) -> None:
        self.name, self.on_the_fly, self.warning, self.products = name, on_the_fly, None, products
        self.me: int | None = None
        self._vector: np.ndarray | None = None
        if on_the_fly:
            if not os.path.exists(str(model)) and not is_hub_id(model):
                raise NothingStoredError(str(model), "not in the store, and neither a local path nor a Hub id")
            self._vector, self.warning, kind = _embed_query(model, base, representation, db, hub_settings)
            self.kinds = [*meta["adapter"], kind]
        else:
            where = np.flatnonzero(meta["model"].to_numpy() == name)
            if not len(where):  # the query's own vector failed its checksum
                line = products.damaged.get(name, "its stored vector is not readable")
                raise StoreError(name, line.removeprefix(f"{name}: "))
            self.me, self.kinds = int(where[0]), list(meta["adapter"])

    def distances(
        self, db: Store, selection: Selection, geo: Geometry, metric: str
    ) -> tuple[np.ndarray, Callable[[int], float]]:
        """Its distances to the stored models, and its inner product with one of them (by row)."""
        if self.me is not None:
            me = self.me
            gram = geo.products_of(me)
            return geo.distances(np.array([me]), np.arange(len(geo)))[0], lambda i: float(gram[i])
        assert self._vector is not None
        dots, squares, _ = db.products_with(selection, self._vector)
        dots, squares = dots[self.products.kept], squares[self.products.kept]
        square = float(np.dot(self._vector.astype(np.float64), self._vector))
        return query_distances(dots, squares, square, metric), lambda i: float(dots[i])

    def vector(self, db: Store, selection: Selection) -> np.ndarray:
        if self._vector is not None:
            return self._vector
        assert self.me is not None
        return _read(db, selection, self.products.kept[[self.me]])[0]


def _local_files(base: str, db: Store, hub_settings: HubSettings | None) -> str:
    from ..run import local_files

    return local_files(base, "", db, hub_settings)


def _read(db: Store, selection: Selection, positions: np.ndarray) -> np.ndarray:
    """The stored vectors at these positions of the selection (a few: the neighbours explained)."""
    at = [int(i) for i in positions]
    return db.vector_file.read(
        [selection.offsets[i] for i in at],
        selection.dim,
        [selection.hashes[i] for i in at],
        [selection.models[i] for i in at],
    )


def _explain(
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
