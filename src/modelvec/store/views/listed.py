"""A population's nearest lists for a scoring and its labels: what ``cluster`` scores from where every pair's products
would not fit (:mod:`modelvec.report.lists`), and what ``embed`` keeps up to date as a crawl stores vectors
(:mod:`modelvec.run.cache_updates`), so that the first ``cluster`` after it reads them.

Which lists (:func:`lists_of`): every model's :data:`~modelvec.store.derived.neighbours.NEAR` nearest among all models
by the ranking (plain distance, or mutual proximity where the scoring says so), its nearest among the models the kNN
score counts, as deep as its dataset needs (its k - 1, its own author's models beside them, at least the voters of a
prediction) and a share more (:data:`SLACK`), and, where neighbours are ranked by mutual proximity, the map's plain
nearest and each model's plain nearest labelled model.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from ...analyse.graph import Lists
from ...analyse.graph_scores import depths_for
from ...analyse.inputs import Scoring, group_codes, label_sets
from ...analyse.proximity import Stats, spread_of
from ..derived.landmarks import Landmarks, update_landmarks
from ..derived.neighbours import (
    MAP_NEAR,
    NEAR,
    PARTS,
    Earlier,
    TaskRunner,
    Wanted,
    earlier_lists,
    nearest_lists,
    ranked_names,
    reranked,
)
from ..formats.cachefile import CacheFile
from .population import Population

#: Room in each model's list beyond what its dataset needs now (a share): a dataset that grows by as much is scored
#: from the kept lists without computing them again.
SLACK = 0.25


@dataclass
class OnLists:
    """What the scores and the map of a population read in place of its pairwise products: each model's nearest
    lists (``near``: by the ranking, among every model; ``map``: by plain distance; ``scored``: among the models the
    kNN score counts, as deep as their datasets; ``voters``: among the labelled ones), each model's distance to its
    nearest labelled model (``nearest_plain``), the landmarks and each model's spread; all of them for the models at
    ``positions`` of the population's selection (its sound vectors), renumbered in that order."""

    positions: np.ndarray
    near: Lists
    map: Lists
    scored: Lists
    voters: Lists
    nearest_plain: np.ndarray
    landmarks: Landmarks
    stats: tuple[np.ndarray, np.ndarray] | None
    eligible: np.ndarray
    labelled: np.ndarray
    groups: np.ndarray | None
    computed: int = 0  # rows computed anew by this call (0: every list read as it was kept)


def lists_of(
    pop: Population,
    meta: pd.DataFrame,
    scoring: Scoring,
    runner: TaskRunner | None = None,
    progress: Callable[[int, int], None] | None = None,
    device: str = "cpu",
) -> OnLists:
    """The population's nearest lists for ``scoring`` (resolved) and the labels in ``meta`` (one row a model of the
    population's selection), kept beside the store or computed in one pass of products (its held blocks run by
    ``runner``: a Ray cluster's tasks; ``progress(done, total)`` after each)."""
    lm = landmarks_of(pop)
    n, metric, scaling = len(meta), scoring.metric, scoring.scaling
    sound = np.ones(n, dtype=bool)
    sound[[i for i, m in enumerate(meta["model"]) if m in pop.damaged]] = False
    sets = label_sets([list(d) for d in meta["datasets"]], n)
    labelled = np.array([bool(s) for s in sets]) & sound
    eligible = labelled if scoring.pool == "labelled" else sound.copy()
    groups = group_codes([a if isinstance(a, str) and a else None for a in meta["author"]], n)
    stats = lm.spread(metric) if scaling != "none" else None
    rank = "plain" if scaling == "none" else "rank"
    votes = scoring.k if scoring.pool == "labelled" else 0
    depth = np.where(sound, depths_for(sets, eligible, groups=groups, votes=votes, slack=SLACK), 0)
    wanted = [Wanted("near", np.where(sound, NEAR, 0), sound, rank), Wanted("scored", depth, eligible, rank)]
    if scaling != "none":
        wanted.append(Wanted("map", np.where(sound, MAP_NEAR, 0), sound, "plain"))
        wanted.append(Wanted("nearest", np.where(sound, 1, 0), labelled, "plain"))
    if scoring.pool != "labelled":
        wanted.append(Wanted("voters", np.where(sound, scoring.k, 0), labelled, rank))
    marks = [pop.selection.hashes[i] for i in lm.positions] if stats is not None else []
    found, computed, exact = nearest_of(
        pop,
        wanted,
        metric=metric,
        stats=stats,
        ranking=json.dumps([scaling, marks]),
        runner=runner,
        progress=progress,
        device=device,
    )
    at = np.flatnonzero(sound)  # the damaged left out: rows and columns renumbered among the sound
    where = np.full(n, -1, np.int64)
    where[at] = np.arange(len(at))
    lists = {name: found[name].subset(at).remapped(where) for name in found}
    scored = lists["scored"]
    nearest = lists.get("nearest", scored)
    first = [nearest.row(i)[2] for i in range(len(at))]
    return OnLists(
        positions=at,
        near=lists["near"],
        map=lists.get("map", lists["near"]),
        scored=scored,
        voters=lists.get("voters", scored),
        nearest_plain=np.array([d[0] if len(d) else np.inf for d in first]),
        landmarks=lm.subset(at),
        stats=(exact[0][at], exact[1][at]) if exact is not None else None,
        eligible=eligible[at],
        labelled=labelled[at],
        groups=groups[at] if groups is not None else None,
        computed=computed,
    )


def landmarks_of(pop: Population, *, verify: bool = True) -> Landmarks:
    """Every vector's products with the landmarks (:mod:`~modelvec.store.derived.neighbours`), kept beside the store:
    a later run computes only new vectors' rows (the landmarks kept as they were drawn, unless one is gone).
    Every vector is read once and checked (``damaged``) unless the vector file is unchanged since they all were
    (its :meth:`~modelvec.store.formats.vectorfile.VectorFile.signature`, kept with what it found damaged then);
    ``verify=False``: only those read (a query checks what its answer shows)."""
    sel, name = pop.selection, "landmarks"
    kept, note = pop.folder.rows(pop.cache_key(), name)
    pop.repaired += [note] if note else []
    earlier = None
    if kept is not None and isinstance(kept.meta.get("landmarks"), list):
        earlier = (kept.meta["hashes"], kept.meta["landmarks"], kept.arrays["dots"], kept.arrays["squares"])
    lm, computed = update_landmarks(pop.db.vector_file, sel, earlier)
    pop.damaged.update(lm.damaged)
    signature = pop.db.vector_file.signature()
    checked = kept.meta.get("checked") if kept is not None and not computed else None
    unchanged = isinstance(checked, dict) and checked.get("signature") == signature and signature is not None
    if unchanged and isinstance(checked, dict):
        pop.damaged.update({m: line for m, line in checked.get("damaged", {}).items() if m in set(sel.models)})
    elif verify:
        if computed < len(sel):  # the rows kept: their vectors are still read once and checked
            read = set(lm.computed.tolist())
            pop.check([i for i in range(len(sel)) if i not in read])
        damaged = {m: line for m, line in pop.damaged.items() if m in set(sel.models)}
        checked = {"signature": signature, "damaged": damaged}
    if computed or (verify and not unchanged):
        meta = {"hashes": list(sel.hashes), "landmarks": [sel.hashes[i] for i in lm.positions], "checked": checked}
        pop.folder.keep_rows(pop.cache_key(), name, meta, {"dots": lm.dots, "squares": lm.squares})
    return lm


def _earlier(
    kept: CacheFile | None, wanted: Sequence[Wanted], ranking: str, stats: Stats | None, hashes: Sequence[str]
) -> Earlier | None:
    """The kept lists a pass can bring up to date: those of the same scaling. Where the landmarks have moved since
    (models added), the lists ranked by mutual proximity have their values restated by the landmarks' spreads now
    (each entry's plain distance kept), so that new columns are offered against the same ranking."""
    was = kept.meta.get("ranking") if kept is not None else None
    if kept is None or not isinstance(was, str) or json.loads(was)[0] != json.loads(ranking)[0]:
        return None
    earlier = earlier_lists(kept, [w.name for w in wanted])
    if earlier is None or was == ranking or stats is None:
        return earlier
    return restated(earlier, ranked_names(wanted), stats, hashes)


def restated(earlier: Earlier, ranked: set[str], stats: Stats, hashes: Sequence[str]) -> Earlier:
    """``earlier`` with the lists named in ``ranked`` ranked by ``stats`` (each model's spread now, for the vectors
    ``hashes``), each entry's plain distance kept: kept lists brought to the spreads a pass now draws by."""
    at = {h: i for i, h in enumerate(hashes)}
    rows = np.array([at.get(h, 0) for h in earlier.hashes], dtype=np.int64)  # a row gone: dropped by the pass
    now = (stats[0][rows], stats[1][rows])
    return replace(earlier, lists=reranked(earlier.lists, ranked, now))


def kept_name(metric: str, ranking: str) -> str:
    """The name the lists of ``metric`` ranked by ``ranking`` (its scaling first) are kept under: one file for
    each ranking, so that asking for the other keeps both."""
    return f"nearest-{metric}-{json.loads(ranking)[0]}"


def kept_lists(
    pop: Population, metric: str, ranking: str, rows: np.ndarray | None = None
) -> tuple[dict[str, Lists], Stats | None] | None:
    """The nearest lists kept beside the store for exactly these vectors and ``ranking`` (as ``cluster`` kept
    them, for whatever labels), verified, and each model's exact spread kept with them; None where none are.
    ``rows``: the lists ranked by mutual proximity are ranked by the exact spreads for these rows alone (the
    others' lists come back empty): what a query that reads a few rows needs."""
    kept, note = pop.folder.rows(pop.cache_key(), kept_name(metric, ranking))
    pop.repaired += [note] if note else []
    if kept is None or kept.meta.get("ranking") != ranking or kept.meta.get("hashes") != list(pop.selection.hashes):
        return None
    names = sorted({key.split(".")[0] for key in kept.arrays if key.endswith(".indptr")})
    earlier = earlier_lists(kept, names)
    if earlier is None:
        return None
    exact = spread_of(earlier.sums) if earlier.sums is not None else None
    return reranked(earlier.lists, set(kept.meta.get("ranked") or []), exact, rows), exact


def nearest_of(
    pop: Population,
    wanted: Sequence[Wanted],
    *,
    metric: str,
    stats: tuple[np.ndarray, np.ndarray] | None,
    ranking: str,
    runner: TaskRunner | None = None,
    progress: Callable[[int, int], None] | None = None,
    device: str = "cpu",
) -> tuple[dict[str, Lists], int, Stats | None]:
    """Every model's ``wanted`` nearest lists (:func:`~modelvec.store.derived.neighbours.nearest_lists`), kept beside
    the store: a later run computes only the rows the kept lists cannot answer (new vectors, labels that changed),
    each against every vector. ``ranking``: what their values follow from (the scaling, the landmarks);
    ``runner``: where the pass's held blocks run (a Ray cluster: :mod:`modelvec.run.ray_blocks`). And how many
    rows were computed, and (``stats`` given: lists by mutual proximity) each model's exact spread, from its
    distances to every other."""
    sel, name = pop.selection, kept_name(metric, ranking)
    kept, note = pop.folder.rows(pop.cache_key(), name)
    pop.repaired += [note] if note else []
    earlier = _earlier(kept, wanted, ranking, stats, sel.hashes)
    if (
        earlier is not None
        and earlier.hashes == list(sel.hashes)
        and all(
            np.array_equal(earlier.depths[w.name], w.depths) and np.array_equal(earlier.eligible[w.name], w.eligible)
            for w in wanted
        )
    ):
        exact = spread_of(earlier.sums) if stats is not None and earlier.sums is not None else None
        if stats is None or exact is not None:
            return reranked(earlier.lists, ranked_names(wanted), exact), 0, exact
    found = nearest_lists(
        pop.db.vector_file,
        sel,
        wanted,
        metric=metric,
        stats=stats,
        earlier=earlier,
        runner=runner,
        progress=progress,
        device=device,
    )
    pop.damaged.update(found.damaged)
    arrays = {f"{w.name}.{part}": getattr(found.drawn[w.name], part) for w in wanted for part in PARTS}
    arrays.update({f"{w.name}.depths": w.depths for w in wanted})
    arrays.update({f"{w.name}.eligible": w.eligible for w in wanted})
    arrays["sums"] = found.sums
    if not found.damaged:  # lists without a damaged vector's row are not what the next run asks for
        meta = {"hashes": list(sel.hashes), "ranking": ranking, "ranked": sorted(ranked_names(wanted))}
        pop.folder.keep_rows(pop.cache_key(), name, meta, arrays)
    return found.lists, found.computed, found.stats
