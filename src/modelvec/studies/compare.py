"""Which representation? The same models embedded every way and scored side by side.

Every variant goes through the store (so a re-run only scores), and is compared with two exact
references: the cosine between whole flattened deltas (task vectors) over the same matrices, and the
same with every matrix's delta unit-normed, computed streaming, one matrix of all models at a time,
never holding all deltas in memory. The scores themselves are :mod:`modelvec.analyse.evaluation`'s; the variants
are :mod:`modelvec.studies.grid`'s, the references :mod:`modelvec.studies.task_vectors`'.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from ..analyse.clustering import clustering_scores
from ..analyse.evaluation import (
    REFERENCE,
    REFERENCE_BN,
    TaskVectors,
    centred,
    cosine_similarities,
    gram_embedding,
    halves,
    score_row,
)
from ..analyse.scores import Scoring, coordinates_of
from ..core.errors import StoreError
from ..core.names import model_id
from ..represent.representation import Representation
from ..run import embed
from ..store import Population, Store, opened
from .grid import VARIANTS
from .task_vectors import task_vector_gram

PathLike = str | os.PathLike[str]


def evaluate(
    base: PathLike,
    models: Sequence[PathLike],
    *,
    variants: dict[str, Representation] | None = None,
    store: Store | PathLike | None = None,
    scoring: Scoring | None = None,
    progress: Callable[[str], None] | None = None,
    split: bool | None = None,
    selection: Sequence[str] | None = None,
    center: bool = False,
    mutual_proximity: bool = False,
    n_boot: int = 2000,
    seeds: Sequence[int] = (Representation.seed,),
) -> pd.DataFrame:
    """Embed ``models`` with every variant (through the store) and score each; rows per method and half.

    With 4 or more datasets (or ``split=True``, or a ``selection``) the models are split by dataset
    (:func:`~modelvec.analyse.evidence.split_datasets`): every method is scored on the selection
    half and on the report half separately, and ``selected`` marks the method with the best kNN
    score on the selection half (ties: higher ``ref_corr``, then the smaller vector). Otherwise
    one half, ``"all"``. ``variants``: name -> representation (default: :data:`VARIANTS`). ``center``: every
    variant is also scored after subtracting the half's mean vector ("NAME + centred"). ``mutual_proximity``:
    every variant is also scored with neighbours ranked by mutual proximity ("NAME + mutual proximity",
    :mod:`~modelvec.analyse.scores`), which puts adapters and full fine-tunes on one scale. ``scoring``: its
    ``metric`` and ``k`` (the voters of the leave-one-out predictions). ``seeds``: every variant is embedded
    with each seed (its projection, rows and solver), its scores are their mean and ``knn_spread`` their range.
    Two exact references are scored beside the variants: the task vectors (the flattened deltas) and
    the same with every matrix's delta unit-normed (what block normalisation approximates). Models
    that fail in any variant are left out of all rows, so every row scores the same set. Columns:
    method, half, params (the representation's key at the first seed; the reference's description), dim,
    seconds_per_model, knn_score, knn_lo, knn_hi (95 % bootstrap interval over models), knn_spread, n_scored,
    loo_accuracy, silhouette, kmeans_nmi, kmeans_ari, hdbscan_nmi, hdbscan_ari, n_clustered, ref_corr, selected;
    with adapters among the models also knn_full, knn_adapters, adapter_to_full and their spreads.
    """
    variants = variants or VARIANTS
    seeds = tuple(seeds) or (Representation.seed,)
    _refuse_equal_parameters(variants)
    say = progress or (lambda _msg: None)
    with opened(store) as db:
        order = _embed_every_variant(db, base, models, variants, seeds, say)
        first = replace(next(iter(variants.values())), seed=seeds[0])
        pop = Population(db, base, first)  # the reports' one way to the store: the base as it is now, no copies
        for line in pop.left_out():
            say(f"note: {line}")
        order = [m for m in order if m in set(pop.meta["model"])]
        if len(order) < 3:
            raise ValueError(f"only {len(order)} models to score once copies are left out; need at least 3")
        base_name = pop.name
        say("reference: task vectors")
        paths = {model_id(m): m for m in models}
        tv = task_vector_gram(base, [paths[m] for m in order])
        meta = pop.meta[pop.meta["model"].isin(set(order))]
        labels = [list(d) for d in meta.drop_duplicates("model").set_index("model").loc[order, "datasets"]]
        scorer = _Scorer(
            labels=labels,
            halves=halves(labels, split, selection),
            tv=tv,
            scoring=scoring or Scoring(),
            center=center,
            scalings=("none", "mutual-proximity") if mutual_proximity else ("none",),
            n_boot=n_boot,
        )
        rows: list[dict[str, object]] = []
        for name, representation in variants.items():  # one variant's vectors in memory at a time
            say(f"scoring: {name}")
            key = replace(representation, seed=seeds[0]).key()
            rows += scorer.rows(name, key, *_seeded_vectors(db, base_name, representation, seeds, order))
        for name, gram, key in _references(tv):
            say(f"scoring: {name}")
            rows += scorer.rows(name, key, [gram_embedding(gram)], tv.seconds_per_model, tv.dim)
    return _table(rows, list(scorer.halves))


def _refuse_equal_parameters(variants: dict[str, Representation]) -> None:
    """Two names for one computation would score it twice under different names: refused, naming both."""
    same: dict[str, str] = {}
    for name, representation in variants.items():
        key = representation.key()
        if key in same:
            raise ValueError(f"variants {same[key]!r} and {name!r} have the same parameters ({key})")
        same[key] = name


def _embed_every_variant(
    db: Store,
    base: PathLike,
    models: Sequence[PathLike],
    variants: dict[str, Representation],
    seeds: Sequence[int],
    say: Callable[[str], None],
) -> list[str]:
    """Embeds ``models`` with every variant at every seed (what the store holds is read, not recomputed); the ids
    of the models embedded in every one, in the order of ``models``. Fewer than 3 is an error."""
    embedded: list[set[str]] = []
    for name, representation in variants.items():
        for seed in seeds:
            say(f"embedding: {name}" + (f" (seed {seed})" if len(seeds) > 1 else ""))
            done = embed(base, models, representation=replace(representation, seed=seed), store=db, load=False)
            embedded.append(set(done.embedded) | set(done.skipped))
    ok = set.intersection(*embedded)
    order = [model_id(m) for m in models if model_id(m) in ok]
    if len(order) < 3:
        raise ValueError(f"only {len(order)} models embedded in every variant; need at least 3 to score")
    return order


def _references(tv: TaskVectors) -> list[tuple[str, np.ndarray, str]]:
    """The exact references scored beside the variants: name, Gram matrix and what stands in the params column."""
    references = [(REFERENCE, tv.gram, "full deltas")]
    if tv.gram_bn is not None:
        references.append((REFERENCE_BN, tv.gram_bn, "full deltas, block-normed"))
    return references


@dataclass(frozen=True, kw_only=True)
class _Scorer:
    """How every method is scored, the same for each: the models' labels, the halves (half -> model indices), the
    exact task vectors (each half's reference geometry, which models are adapters) and the options."""

    labels: list[list[str]]
    halves: dict[str, np.ndarray]
    tv: TaskVectors
    scoring: Scoring
    center: bool
    scalings: tuple[str, ...]
    n_boot: int

    def rows(self, name: str, key: str, Xs: list[np.ndarray], seconds: float, dim: int) -> list[dict[str, object]]:
        """One method's rows: per half, centred or not (``center``) and per scaling; ``Xs``: its vectors of
        every model, one matrix per seed."""
        out = []
        for half, idx in self.halves.items():
            labels = [self.labels[i] for i in idx]
            reference = cosine_similarities(gram_embedding(self.tv.gram[np.ix_(idx, idx)]))
            for is_centred in (False, True) if self.center else (False,):
                vectors = [centred(X[idx]) if is_centred else X[idx] for X in Xs]
                clusters = clustering_scores(vectors[0], labels, metric=self.scoring.metric)  # blind to the scaling
                for scaling in self.scalings:
                    row = score_row(
                        name
                        + (" + centred" if is_centred else "")
                        + (" + mutual proximity" if scaling != "none" else ""),
                        vectors,
                        labels,
                        reference,
                        metric=self.scoring.metric,
                        k=self.scoring.k,
                        is_adapter=self.tv.is_adapter[idx],
                        n_boot=self.n_boot,
                        scaling=scaling,
                        clustering=clusters,
                    )
                    row.update(half=half, params=key, dim=dim, seconds_per_model=seconds)
                    out.append(row)
        return out


def _seeded_vectors(
    db: Store, base: str | None, representation: Representation, seeds: Sequence[int], order: Sequence[str]
) -> tuple[list[np.ndarray], float, int]:
    """A variant's stored vectors of the models in ``order``, as coordinates, one matrix per seed; the median over
    seeds of the models' median seconds; the vectors' dimension."""
    Xs, seconds, dim = [], [], 0
    for seed in seeds:
        Z, meta, dim = _coordinates(db, base, replace(representation, seed=seed), order)
        index = {m: i for i, m in enumerate(meta["model"])}
        Xs.append(Z[[index[m] for m in order]])
        seconds.append(float(meta.set_index("model").loc[order]["seconds"].median()))
    return Xs, float(np.median(seconds)), dim


#: The table's columns, in order (those of adapters only where adapters are among the models).
COLUMNS = (
    "method",
    "half",
    "params",
    "dim",
    "seconds_per_model",
    "knn_score",
    "knn_lo",
    "knn_hi",
    "knn_spread",
    "n_scored",
    "loo_accuracy",
    "silhouette",
    "kmeans_nmi",
    "kmeans_ari",
    "hdbscan_nmi",
    "hdbscan_ari",
    "n_clustered",
    "ref_corr",
    "knn_full",
    "knn_adapters",
    "adapter_to_full",
    "knn_full_spread",
    "knn_adapters_spread",
    "selected",
)


def _table(rows: list[dict[str, object]], halves: list[str]) -> pd.DataFrame:
    """The rows as a table, each half's together (in the order of ``halves``), with ``selected`` marking the
    method (not a reference) with the best kNN score on the first half: ties, higher ``ref_corr``, then smaller."""
    frame = pd.DataFrame(rows)
    order_of = {half: i for i, half in enumerate(halves)}
    frame = frame.sort_values("half", key=lambda h: h.map(order_of), kind="stable").reset_index(drop=True)
    pick = frame[(frame["half"] == halves[0]) & ~frame["method"].str.startswith("task vectors")]
    pick = pick.sort_values(["knn_score", "ref_corr", "dim"], ascending=[False, False, True], kind="stable")
    frame["selected"] = frame["method"] == pick["method"].iloc[0]
    return frame[[c for c in COLUMNS if c in frame.columns]]


def _coordinates(
    db: Store, base: str | None, representation: Representation, models: Sequence[str]
) -> tuple[np.ndarray, pd.DataFrame, int]:
    """The stored vectors of ``models`` as coordinates with the same inner products (from their products, read
    from the vector file in blocks: never the vectors themselves), their metadata and the vectors' dimension.
    Every model must be readable: a damaged vector is an error naming it."""
    version = Population(db, base, representation).base_hash
    selection, meta = db.reads.select(base=base, representation=representation, models=models, base_hash=version)
    products = db.reads.products(selection)
    if products.damaged:
        model, line = next(iter(products.damaged.items()))
        raise StoreError(model, line.removeprefix(f"{model}: "))
    return coordinates_of(products.gram), meta, selection.dim
