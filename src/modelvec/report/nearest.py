"""Which stored models are like mine? The nearest stored models to any model, and the dataset they suggest.

A model that is not in the store (a local folder, a LoRA adapter or a Hub id) is embedded on the fly
with the stored representation against the stored base, compared, and not stored.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ..analyse.scores import (
    NEIGHBORS_SCORING,
    Geometry,
    Scoring,
    majority_dataset,
    nearest_to,
    query_distances,
    yardstick,
)
from ..analyse.tree.copies import Copy
from ..core.errors import NothingStoredError, StoreError
from ..core.names import is_hub_id
from ..core.settings import taken_from, with_options
from ..represent.representation import Representation
from ..store import Population, Products, Store, opened
from ..store.derived.products import Compute
from .nearest_parts import IS_A_COPY, IS_THE_BASE, Neighbors, embed_query, explain_of, place_of

if TYPE_CHECKING:
    from ..hub.client import HubSettings

PathLike = str | os.PathLike[str]


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

    The stored models are the base's :class:`~modelvec.store.Population` (embedded against the base as it is now,
    copies of the base left out). Their kept products are verified; the vectors are read only for those the answer
    shows (the query's, its nearest and the voters): one whose bytes are damaged is left out (``damaged``).
    """
    scoring = with_options(Scoring, scoring, taken_from(Scoring, options), "neighbors", default=NEIGHBORS_SCORING)
    compute = with_options(Compute, None, options, "neighbors")
    k = scoring.k
    with opened(store, read_only=True) as db:
        pop = Population.of_query(db, model, base, representation)
        asked, copied, name = _asked(pop, model)
        notes = _notes(pop, asked, copied, name)
        if compute.neighbours_for(len(pop.selection)) == "lists":
            from .nearest_lists import neighbors_on_lists

            return neighbors_on_lists(
                pop, asked, name, model, scoring, hub_settings=hub_settings, notes=notes, explain=explain
            )
        products, meta = pop.products(verify=False)
        query = _Query(name, model, meta, pop, hub_settings, products)
        resolved, scaling_note = pop.resolve(scoring, query.kinds)
        geo = pop.geometry(products, resolved)
        distances, first_dot = query.distances(pop, geo, scoring.metric)
        order, dist_all = nearest_to(geo, distances, k=len(meta), exclude=query.me, scaling=resolved.scaling)
        labels = [list(d) for d in meta["datasets"]]
        order, dist_all = _verified(pop, products.positions, order, dist_all, labels, k)
        idx = order[:k]
        neighbours = (query.vector(pop), pop.rows(products.positions[idx])) if explain else None
        base_files = pop.base_files(hub_settings or _hub_settings(), fetch=True) if explain else None
        place = None if query.on_the_fly else place_of(pop, asked)
    found = meta.iloc[idx][["model", "datasets", "label_source", "author"]].reset_index(drop=True)
    found.insert(1, "distance", dist_all[:k])
    voters = [i for i in order.tolist() if labels[i]][:k]  # the k nearest labelled models, in the same order
    predicted, share, votes, near = _predicted(geo, labels, voters, order, dist_all, resolved, query.me, first_dot)
    explanation = None
    if base_files is not None and neighbours is not None:
        explanation = explain_of(neighbours[0], neighbours[1], found["model"], base_files, pop.representation)
    return Neighbors(
        query=asked,
        base=pop.name,
        params=pop.representation.key(),
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
        scaling=resolved.scaling,
        scaling_note=scaling_note,
        damaged=dict(pop.damaged),
        tree=place,
        notes=notes,
        repaired=list(pop.repaired),
    )


def _notes(pop: Population, asked: str, copied: Copy | None, name: str) -> list[str]:
    """What the answer says besides: what the population left out, and that a copy's original answers for it."""
    notes = pop.left_out()
    if copied is not None:
        notes.insert(0, f"{asked} is {copied.describe(pop.name)}: off the map, {name} stands for it: its neighbours")
    return notes


def _asked(pop: Population, model: PathLike | str) -> tuple[str, Copy | None, str]:
    """The model asked about as stored (an alias: the model it names), the copy it is (None: none), and the model
    answered for: a copy's original stands for it on the map. The base, or a copy of it, has no neighbours."""
    asked = pop.stored_name(model)
    if pop.is_base(model):
        raise NothingStoredError(asked, IS_THE_BASE)
    copied = pop.copies.get(asked)
    name = copied.original if copied is not None else asked
    if name == pop.name:
        raise NothingStoredError(asked, IS_A_COPY)
    return asked, copied, name


def _predicted(
    geo: Geometry,
    labels: list[list[str]],
    voters: list[int],
    order: np.ndarray,
    distances: np.ndarray,
    scoring: Scoring,
    me: int | None,
    first_dot: Callable[[int], float],
) -> tuple[str | None, float, dict[str, int], float]:
    """The majority dataset of the ``voters`` (None: none labelled), its vote share, the votes, and how near the
    nearest voter is by the stored models' own yardstick (the query's row ``me`` is not its own ruler)."""
    if not voters:
        return None, float("nan"), {}, float("nan")
    predicted, share, votes = majority_dataset([labels[i] for i in voters])
    ruler = yardstick(geo, labels, metric=scoring.metric, scaling=scoring.scaling, exclude=me)
    near = ruler.closeness(float(distances[order == voters[0]][0]), shares_direction=first_dot(voters[0]) > 0)
    return predicted, share, votes, near


def _hub_settings() -> HubSettings:
    from ..hub.client import HubSettings

    return HubSettings()


def _verified(
    pop: Population, kept: np.ndarray, order: np.ndarray, distances: np.ndarray, labels: list[list[str]], k: int
) -> tuple[np.ndarray, np.ndarray]:
    """``order`` (and its ``distances``) without the models whose vectors' bytes are damaged, among those the answer
    shows: the ``k`` nearest and the ``k`` nearest labelled (the voters). The kept products were verified, the
    vectors were not: a vector damaged since is left out as ``cluster`` leaves it out."""
    good: list[int] = []
    voters = min(k, sum(1 for i in order if labels[i]))
    for start in range(0, len(order), k):
        chunk = order[start : start + k]
        sound = set(pop.check(kept[chunk]))
        good += [start + j for j, i in enumerate(chunk) if kept[i] in sound]
        if len(good) >= k and sum(1 for j in good if labels[order[j]]) >= voters:
            good += list(range(start + len(chunk), len(order)))  # beyond what the answer shows: not read
            break
    return order[good], distances[good]


class _Query:
    """The model asked about: a stored one (its row ``me``), or one embedded now (its vector, compared with the
    stored ones in one pass over them)."""

    def __init__(
        self,
        name: str,
        model: PathLike | str,
        meta: pd.DataFrame,
        pop: Population,
        hub_settings: HubSettings | None,
        products: Products,
    ) -> None:
        self.name, self.warning, self.products = name, None, products
        self.on_the_fly = name not in set(pop.meta["model"])
        self.me: int | None = None
        self._vector: np.ndarray | None = None
        if self.on_the_fly:
            if not os.path.exists(str(model)) and not is_hub_id(model):
                raise NothingStoredError(str(model), "not in the store, and neither a local path nor a Hub id")
            self._vector, self.warning, kind = embed_query(model, pop, hub_settings)
            if not self._vector.any():  # the base under another name, or a copy of it: no direction to compare
                raise NothingStoredError(name, IS_A_COPY)
            self.kinds = [*meta["adapter"], kind]
            return
        where = np.flatnonzero(meta["model"].to_numpy() == name)
        line = products.damaged.get(name, "its stored vector is not readable")
        if not len(where) or not pop.check([products.positions[where[0]]]):  # its own vector failed its checksum
            raise StoreError(name, pop.damaged.get(name, line).removeprefix(f"{name}: "))
        self.me, self.kinds = int(where[0]), list(meta["adapter"])

    def distances(self, pop: Population, geo: Geometry, metric: str) -> tuple[np.ndarray, Callable[[int], float]]:
        """Its distances to the stored models, and its inner product with one of them (by row)."""
        if self.me is not None:
            me = self.me
            gram = geo.products_of(me)
            return geo.distances(np.array([me]), np.arange(len(geo)))[0], lambda i: float(gram[i])
        assert self._vector is not None
        dots, squares = pop.products_with(self._vector, self.products.positions)
        square = float(np.dot(self._vector.astype(np.float64), self._vector))
        return query_distances(dots, squares, square, metric), lambda i: float(dots[i])

    def vector(self, pop: Population) -> np.ndarray:
        if self._vector is not None:
            return self._vector
        assert self.me is not None
        return pop.rows(self.products.positions[[self.me]])[0]
