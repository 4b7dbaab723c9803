"""``neighbors`` where the population's scores read nearest lists (above
:data:`~modelvec.store.derived.products.PAIRS_UP_TO` models, or ``--neighbours lists``): a stored model's nearest and
its voters are read from the lists ``cluster`` keeps beside the store (no vector read but those the answer shows); a
model that is not stored, or a store whose lists are not kept for these vectors, is compared with every stored vector in
one pass over them (exact, the time of one read of the vector file). Each model's spread for mutual proximity, and what
near and far mean for the prediction's closeness, come from the landmarks."""

from __future__ import annotations

import json

import numpy as np

from ..analyse.geometry import query_distances
from ..analyse.graph import Lists, Searched, search
from ..analyse.neighbours import majority_dataset
from ..analyse.proximity import scaled
from ..analyse.scores import Scoring
from ..core.errors import NothingStoredError, StoreError
from ..hub.client import HubSettings
from ..store import Population
from ..store.derived.landmarks import Landmarks
from ..store.derived.neighbours import NEAR
from ..store.views.listed import kept_lists, landmarks_of
from .lists import stick_of
from .nearest_parts import IS_A_COPY, Neighbors, embed_query, explain_of, place_of


def neighbors_on_lists(
    pop: Population, asked: str, name: str, model: object, scoring: Scoring, **rest: object
) -> Neighbors:
    """The answer of :func:`~modelvec.report.nearest.neighbors` for ``name`` (the stored model ``asked`` stands
    for, or one embedded now from ``model``) from nearest lists; ``rest``: the query's settings there
    (``hub_settings``, ``notes``)."""
    from .nearest_parts import Neighbors

    meta = pop.meta
    models = list(meta["model"])
    notes: list[str] = list(rest.get("notes") or [])  # type: ignore[call-overload]
    on_the_fly, warning, me = name not in set(models), None, None
    vector = None
    if on_the_fly:
        vector, warning, kind = embed_query(model, pop, rest.get("hub_settings"))  # type: ignore[arg-type]
        if not vector.any():
            raise NothingStoredError(name, IS_A_COPY)
        kinds = [*meta["adapter"], kind]
    else:
        me = models.index(name)
        if not pop.check([me]):
            raise StoreError(name, pop.damaged.get(name, "its stored vector is not readable").removeprefix(f"{name}: "))
        kinds = list(meta["adapter"])
    resolved, scaling_note = pop.resolve(scoring, kinds)
    lm = landmarks_of(pop, verify=False)
    marks = [pop.selection.hashes[i] for i in lm.positions] if resolved.scaling != "none" else []
    rows = None if me is None else np.union1d([me], lm.positions)  # a stored model: its own lists, the landmarks'
    listed = kept_lists(pop, scoring.metric, json.dumps([resolved.scaling, marks]), rows)
    kept = listed[0] if listed is not None else None
    stats = None  # each model's spread: the exact ones the kept lists were ranked by, else the landmarks'
    if resolved.scaling != "none":
        stats = listed[1] if listed is not None and listed[1] is not None else lm.spread(scoring.metric)
    labels = [list(d) for d in meta["datasets"]]
    labelled = np.array([bool(x) for x in labels])
    k = resolved.k
    order, values = _ordered(pop, lm, kept, stats, resolved, me, vector, labelled, notes)
    order, values = _shown(pop, order, values, labelled, k)
    found = meta.iloc[order[:k]][["model", "datasets", "label_source", "author"]].reset_index(drop=True)
    found.insert(1, "distance", values[:k])
    voters = [int(i) for i in order if labelled[i]][:k]
    predicted, share, near = None, float("nan"), float("nan")
    votes: dict[str, int] = {}
    if voters:
        predicted, share, votes = majority_dataset([labels[i] for i in voters])
        first = float(values[list(order).index(voters[0])])
        voting = kept.get("voters", kept["scored"]) if kept is not None else None
        near = stick_of(lm, labelled, stats, resolved.metric, voting).closeness(first)
    explanation = None
    if rest.get("explain"):
        files = pop.base_files(rest.get("hub_settings") or HubSettings(), fetch=True)  # type: ignore[arg-type]
        mine = vector if vector is not None else pop.rows([int(me or 0)])[0]
        if files is not None:
            explanation = explain_of(mine, pop.rows(order[:k]), found["model"], files, pop.representation)
    return Neighbors(
        query=asked,
        base=pop.name,
        params=pop.representation.key(),
        on_the_fly=on_the_fly,
        nearest=found,
        predicted=predicted,
        confidence=share * near,
        votes=votes,
        vote_share=share,
        closeness=near,
        warning=warning,
        explanation=explanation,
        voters=len(voters),
        scaling=resolved.scaling,
        scaling_note=scaling_note,
        damaged=dict(pop.damaged),
        tree=None if on_the_fly else place_of(pop, asked),
        notes=notes,
        repaired=list(pop.repaired),
    )


def _ordered(
    pop: Population,
    lm: Landmarks,
    kept: dict[str, Lists] | None,
    stats: tuple[np.ndarray, np.ndarray] | None,
    scoring: Scoring,
    me: int | None,
    vector: np.ndarray | None,
    labelled: np.ndarray,
    notes: list[str],
) -> tuple[np.ndarray, np.ndarray]:
    """The query's nearest stored models, nearest first, with their values: a stored model's from its kept lists,
    a model not stored by walking them (said in ``notes``), else from every stored vector."""
    k = scoring.k
    from_kept = _from_lists(kept, me, labelled, k) if kept is not None and me is not None else None
    if from_kept is not None:
        return from_kept
    if kept is not None and vector is not None:
        searched = searched_of(pop, lm, kept, stats, scoring.metric, vector)
        if labelled[searched.order].sum() >= min(k, labelled.sum()):  # else too few to vote: every vector
            notes.append(_walked(searched.computed, len(labelled)))
            return searched.order, searched.values
    return _scanned(pop, lm, stats, scoring, me, vector)


def _from_lists(kept: dict[str, Lists], me: int, labelled: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray] | None:
    """A stored model's nearest from the kept lists: its ``near`` list, and its nearest labelled (``scored``, or
    ``voters``) merged in order; None where they hold fewer than ``k`` of either that there are."""
    cols, values, _ = kept["near"].row(me)
    voters = kept.get("voters", kept["scored"]).row(me)
    if len(cols) < min(k, len(labelled) - 1) or k > NEAR:
        return None
    mine = dict(zip(cols.tolist(), values.tolist()))
    mine.update(zip(voters[0].tolist(), voters[1].tolist()))
    order = sorted(mine, key=lambda j: (mine[j], j))
    if sum(1 for j in order if labelled[j]) < min(k, int(labelled.sum()) - int(labelled[me])):
        return None
    return np.array(order, dtype=np.int64), np.array([mine[j] for j in order])


def _scanned(
    pop: Population,
    lm: Landmarks,
    stats: tuple[np.ndarray, np.ndarray] | None,
    scoring: Scoring,
    me: int | None,
    vector: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray]:
    """The query's distances to every stored model from one pass over their vectors, ranked (by mutual proximity:
    the stored models' spreads from the landmarks, the query's from its distances to them), nearest first."""
    every = np.arange(len(pop.meta))
    if vector is None:
        assert me is not None
        vector = pop.rows([me])[0]
    dots, squares = pop.products_with(vector, every)
    D = query_distances(dots, squares, float(np.dot(vector.astype(np.float64), vector)), scoring.metric)
    if me is not None:
        D[me] = np.inf
    if stats is not None:
        if me is not None:
            own = (stats[0][[me]], stats[1][[me]])
        else:
            to = D[lm.positions]
            own = (np.array([to.mean()]), np.array([to.std()]))
        D = scaled(D[None, :], own, stats)[0]
        if me is not None:
            D[me] = np.inf
    order = np.argsort(D, kind="stable")
    order = order[np.isfinite(D[order])]
    return order, D[order]


#: How many of a query's nearest a walk of the kept lists keeps looking for (its width; :func:`searched_of`).
SEARCH_WIDTH = 64


def searched_of(
    pop: Population,
    lm: Landmarks,
    kept: dict[str, Lists],
    stats: tuple[np.ndarray, np.ndarray] | None,
    metric: str,
    vector: np.ndarray,
    width: int = SEARCH_WIDTH,
) -> Searched:
    """A query's nearest stored models found by walking the kept lists (:func:`~modelvec.analyse.graph.search`),
    entered from the landmarks and from the :data:`ENTRIES` models whose distances to the landmarks correlate best
    with the query's: each distance exact, from the vectors read (each checked) as the walk reaches them, never
    every vector. By mutual proximity (``stats``: the stored models' spreads), every model reached is ranked by it,
    the query's own spread from its distances to the landmarks. Its recall against every vector compared is
    measured by ``bench/bench_search.py``."""
    vector = vector.astype(np.float64)
    square = float(np.dot(vector, vector))
    known: dict[int, float] = {}

    def distances(cols: np.ndarray) -> np.ndarray:
        new = np.array([j for j in cols.tolist() if j not in known], dtype=np.int64)
        d = np.full(len(new), np.inf)
        try:
            sound = np.arange(len(new))
            rows = pop.rows(new).astype(np.float64)
        except StoreError:  # a damaged vector among them: named in ``damaged``, the others read
            sound = np.flatnonzero(np.isin(new, pop.check(new)))
            rows = pop.rows(new[sound]).astype(np.float64)
        if len(sound):
            d[sound] = query_distances(rows @ vector, np.einsum("ij,ij->i", rows, rows), square, metric)
        known.update(zip(new.tolist(), d.tolist()))
        return np.array([known[j] for j in cols.tolist()])

    to = distances(lm.positions)
    entries = np.concatenate([lm.positions, _alike(lm.distances(metric), to)])
    found = search([kept[name] for name in WALKED if name in kept], distances, entries, width=width)
    if stats is None:
        return Searched(found.order, found.values, len(known))
    reached = np.array(sorted(j for j, v in known.items() if np.isfinite(v)), dtype=np.int64)
    D = np.array([known[j] for j in reached.tolist()])
    fine = np.isfinite(to)
    own = (np.array([to[fine].mean()]), np.array([to[fine].std()]))
    R = scaled(D[None, :], own, (stats[0][reached], stats[1][reached]))[0]
    order = np.lexsort((reached, R))[:width]
    return Searched(reached[order], R[order], len(known))


#: The kept lists a walk follows: each model's nearest (by the ranking, and plain under mutual proximity).
WALKED = ("near", "map")

#: How many models beside the landmarks a walk of the kept lists starts from: those whose distances to the
#: landmarks correlate best with the query's.
ENTRIES = 64


def _alike(profiles: np.ndarray, mine: np.ndarray) -> np.ndarray:
    """The :data:`ENTRIES` rows of ``profiles`` (each model's distances to the landmarks) most correlated with
    ``mine`` (the query's)."""
    fine = np.isfinite(mine)
    P = profiles[:, fine] - profiles[:, fine].mean(axis=1, keepdims=True)
    q = mine[fine] - mine[fine].mean()
    score = (P @ q) / np.maximum(np.linalg.norm(P, axis=1) * np.linalg.norm(q), 1e-300)
    score[~np.isfinite(score)] = -np.inf
    take = min(ENTRIES, len(score))
    return np.argpartition(-score, take - 1)[:take] if take else np.zeros(0, np.int64)


def _walked(computed: int, n: int) -> str:
    return (
        f"its nearest found by walking the kept nearest lists: {computed:,} of the {n:,} stored vectors read, "
        "each distance exact (bench/bench_search.py measures what the walk misses)"
    )


def _shown(
    pop: Population, order: np.ndarray, values: np.ndarray, labelled: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """``order`` without the models whose vectors' bytes are damaged among those the answer shows (the ``k`` nearest
    and the ``k`` nearest labelled): those vectors are read and checked, no other."""
    good: list[int] = []
    want = min(k, int(labelled[order].sum()))
    for start in range(0, len(order), k):
        chunk = order[start : start + k]
        sound = set(pop.check(chunk))
        good += [start + j for j, i in enumerate(chunk) if int(i) in sound]
        if len(good) >= k and sum(1 for j in good if labelled[order[j]]) >= want:
            good += list(range(start + len(chunk), len(order)))
            break
    return order[good], values[good]
