"""Which representation? The same models embedded every way and scored side by side.

Every variant goes through the store (so a re-run only scores), and is compared with two exact
references: the cosine between whole flattened deltas (task vectors) over the same matrices, and the
same with every matrix's delta unit-normed, computed streaming, one tensor of all models at a time,
never holding all deltas in memory. The scores themselves are :mod:`modelvec.analyse.evaluation`'s.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch

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
from ..analyse.scores import Scoring, clustering_scores, coordinates_of
from ..core.errors import StoreError
from ..core.names import model_id
from ..read import open_checkpoint
from ..represent.representation import Representation
from ..run import embed
from ..store import Store, opened

if TYPE_CHECKING:
    from ..read import Checkpoint, MatrixRef

PathLike = str | os.PathLike[str]


def variants(
    ranks: Sequence[int] = (Representation.rank,),
    vocabulary_head: bool = False,
    *,
    rows: Sequence[float | str] = (1.0,),
    projections: Sequence[str] = ("shared",),
    svd: bool = True,
    default: bool = True,
) -> dict[str, Representation]:
    """The representations compared, named by their parameters (:meth:`Representation.label`).

    With ``svd``, the description's factors as the original study ran them (U, raw signs), with
    canonical signs, scaled by Σ, and the singular values alone, each pooled by mean and (U·Σ)
    concatenated over layers, with and without block normalisation. The sketch with each of
    ``projections``, reading each share of ``rows``, pooled by mean and concatenated, block-normalised
    (and without block normalisation for the shared projection of whole matrices, as first compared).
    Every one at every rank in ``ranks``, of the deltas alone (no head). ``vocabulary_head``: also the
    block-normalised sketches (mean and concat) of the first projection and share with the head's vocabulary
    prior appended. ``default``: also the default representation (:class:`Representation`'s defaults).
    """
    svd_grid = [
        dict(factor="U", sign="none"),
        dict(factor="U"),
        dict(factor="US", sign="none"),
        dict(factor="US"),
        dict(factor="US", pooling="concat"),
        dict(factor="S"),
    ]
    out: dict[str, Representation] = {}

    def add(representation: Representation) -> None:
        out[representation.label()] = representation

    for block_norm in (False, True):
        for rank in ranks:
            for fields in svd_grid if svd else []:
                add(Representation(rank=rank, block_norm=block_norm, head="none", **fields))  # type: ignore[arg-type]
            for projection in projections:
                for share in rows:
                    if not block_norm and (projection, share) != ("shared", 1.0):
                        continue
                    for pooling in ("mean", "concat"):
                        add(
                            Representation(
                                rank=rank,
                                projection=projection,
                                rows=share,
                                pooling=pooling,
                                block_norm=block_norm,
                                head="none",
                            )
                        )
    if vocabulary_head:
        for rank in ranks:
            for pooling in ("mean", "concat"):
                add(
                    Representation(
                        rank=rank, projection=projections[0], rows=rows[0], pooling=pooling, head="vocabulary"
                    )
                )
    if default:  # marked in its name; where the grid has it already, that row is renamed
        chosen = Representation()
        out = {f"{name} (default)" if r == chosen else name: r for name, r in out.items()}
        if chosen not in out.values():
            out[f"{chosen.label()} (default)"] = chosen
    return out


#: The default comparison: every variant at the default rank (16 distinct parameter sets).
VARIANTS: dict[str, Representation] = variants()


def task_deltas(
    base_ck: Checkpoint, cks: Sequence[Checkpoint]
) -> Iterator[tuple[MatrixRef, torch.Tensor, dict[int, torch.Tensor]]]:
    """Per matrix of the base, one at a time: the base's matrix and each model's delta, float64.

    A full fine-tune's delta is W_ft - W_base; a LoRA adapter's is its factors' product, and a
    matrix the adapter leaves alone has no entry.
    """
    base_layout = base_ck.layout()
    layouts = [None if ck.factored else ck.layout() for ck in cks]
    shapes = {ref.key: tuple(base_ck.matrix(ref, base_layout.prefix, stored=True).shape) for ref in base_layout.refs}
    factored = {i: ck.low_rank_deltas(base_layout, shapes) for i, ck in enumerate(cks) if ck.factored}
    for ref in base_layout.refs:
        w0 = base_ck.matrix(ref, base_layout.prefix).double()
        deltas = {}
        for i, (ck, lay) in enumerate(zip(cks, layouts)):
            if lay is not None:
                deltas[i] = ck.matrix(ref, lay.prefix).double() - w0
            elif ref.key in factored[i]:
                low = factored[i][ref.key]
                deltas[i] = low.left.double() @ low.right.double().T
        yield ref, w0, deltas


def task_vector_gram(base: PathLike, models: Sequence[PathLike]) -> TaskVectors:
    """G[i, j] = <dW_i, dW_j> over all representation matrices, one tensor of all models at a time.

    A LoRA adapter's delta is its factors' product (zero for the matrices it leaves alone), formed
    one matrix at a time like a full fine-tune's (:func:`task_deltas`).
    """
    start = time.perf_counter()
    cks = [open_checkpoint(m) for m in models]
    gram = np.zeros((len(cks), len(cks)))
    gram_bn = np.zeros((len(cks), len(cks)))
    dim = 0
    for _, w0, deltas in task_deltas(open_checkpoint(base), cks):
        rows = [deltas[i].reshape(-1) if i in deltas else w0.new_zeros(w0.numel()) for i in range(len(cks))]
        stacked = torch.stack(rows)
        block = (stacked @ stacked.T).numpy()
        gram += block
        norms = np.sqrt(np.clip(np.diag(block), 0, None))
        unit = np.divide(1.0, norms, out=np.zeros_like(norms), where=norms > 0)
        gram_bn += block * unit[:, None] * unit[None, :]
        dim += w0.numel()
    seconds = (time.perf_counter() - start) / max(len(cks), 1)
    return TaskVectors(gram, dim, seconds, np.array([ck.factored for ck in cks], dtype=bool), gram_bn)


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
    seeds: Sequence[int] = (0,),
) -> pd.DataFrame:
    """Embed ``models`` with every variant (through the store) and score each; rows per method and half.

    With 4 or more datasets (or ``split=True``, or a ``selection``) the models are split by dataset
    (:func:`~modelvec.analyse.evidence.split_datasets`): every method is scored on the selection
    half and on the report half separately, and ``selected`` marks the method with the best kNN
    score on the selection half (ties: higher ``ref_corr``, then the smaller vector). Otherwise
    one half, ``"all"``. ``center``: every variant is also scored after subtracting the half's mean
    vector ("NAME + centred"). ``mutual_proximity``: every variant is also scored with neighbours
    ranked by mutual proximity ("NAME + mutual proximity", :mod:`~modelvec.analyse.scores`), which
    puts adapters and full fine-tunes on one scale. ``scoring``: its ``metric`` and ``k`` (the voters of the
    leave-one-out predictions). ``seeds``: every variant is embedded with each
    seed (its projection, rows and solver), its scores are their mean and ``knn_spread`` their range.
    Two exact references are scored beside the variants: the task vectors (the flattened deltas) and
    the same with every matrix's delta unit-normed (what block normalisation approximates). Models
    that fail in any variant are left out of all rows, so every row scores the same set. Columns:
    method, half, representation, dim, seconds_per_model, knn_score, knn_lo, knn_hi (95 % bootstrap interval
    over models), knn_spread, n_scored, loo_accuracy, silhouette, kmeans_nmi, kmeans_ari, hdbscan_nmi,
    hdbscan_ari, n_clustered, ref_corr, selected; with adapters among the models also knn_full,
    knn_adapters, adapter_to_full and their spreads.
    """
    variants = variants or VARIANTS
    seeds = tuple(seeds) or (0,)
    scoring = scoring or Scoring()
    metric, k = scoring.metric, scoring.k
    same: dict[str, str] = {}
    for name, representation in variants.items():
        if representation.key() in same:
            raise ValueError(
                f"variants {same[representation.key()]!r} and {name!r} have the same parameters ({representation.key()})"
            )
        same[representation.key()] = name
    say = progress or (lambda _msg: None)
    with opened(store) as db:
        embedded: list[set[str]] = []
        for name, representation in variants.items():
            for seed in seeds:
                say(f"embedding: {name}" + (f" (seed {seed})" if len(seeds) > 1 else ""))
                done = embed(base, models, representation=replace(representation, seed=seed), store=db, load=False)
                embedded.append(set(done.embedded) | set(done.skipped))
        ok = set.intersection(*embedded)
        paths = {model_id(m): m for m in models}
        order = [model_id(m) for m in models if model_id(m) in ok]
        if len(order) < 3:
            raise ValueError(f"only {len(order)} models embedded in every variant; need at least 3 to score")
        say("reference: task vectors")
        tv = task_vector_gram(base, [paths[m] for m in order])
        base_name = model_id(base) if Path(str(base)).exists() else None
        first = next(iter(variants.values()))
        meta = db.metadata(base=base_name, representation=replace(first, seed=seeds[0]), models=order)
        labels = [list(d) for d in meta.drop_duplicates("model").set_index("model").loc[order, "datasets"]]
        split_halves = halves(labels, split, selection)
        scalings = ("none", "mutual-proximity") if mutual_proximity else ("none",)
        references = [(REFERENCE, tv.gram, "full deltas")]
        if tv.gram_bn is not None:
            references.append((REFERENCE_BN, tv.gram_bn, "full deltas, block-normed"))

        def score(name: str, key: str, Xs: list[np.ndarray], secs: float, dim: int) -> list[dict[str, object]]:
            out = []
            for half, idx in split_halves.items():
                sub_labels = [labels[i] for i in idx]
                reference = cosine_similarities(gram_embedding(tv.gram[np.ix_(idx, idx)]))
                for is_centred in (False, True) if center else (False,):
                    vectors = [centred(X[idx]) if is_centred else X[idx] for X in Xs]
                    clusters = clustering_scores(vectors[0], sub_labels, metric=metric)  # blind to the scaling
                    for scaling in scalings:
                        row = score_row(
                            name
                            + (" + centred" if is_centred else "")
                            + (" + mutual proximity" if scaling != "none" else ""),
                            vectors,
                            sub_labels,
                            reference,
                            metric=metric,
                            k=k,
                            is_adapter=tv.is_adapter[idx],
                            n_boot=n_boot,
                            scaling=scaling,
                            clustering=clusters,
                        )
                        row.update(half=half, params=key, dim=dim, seconds_per_model=secs)
                        out.append(row)
            return out

        rows: list[dict[str, object]] = []
        for name, representation in variants.items():  # one variant's vectors in memory at a time
            say(f"scoring: {name}")
            Xs, seconds = [], []
            for seed in seeds:
                Z, vmeta, dim = _coordinates(db, base_name, replace(representation, seed=seed), order)
                index = {m: i for i, m in enumerate(vmeta["model"])}
                Xs.append(Z[[index[m] for m in order]])
                seconds.append(float(vmeta.set_index("model").loc[order]["seconds"].median()))
            key = replace(representation, seed=seeds[0]).key()
            rows += score(name, key, Xs, float(np.median(seconds)), dim)
            del Xs
        for name, gram, key in references:
            say(f"scoring: {name}")
            rows += score(name, key, [gram_embedding(gram)], tv.seconds_per_model, tv.dim)
    frame = pd.DataFrame(rows)
    order_of = {half: i for i, half in enumerate(split_halves)}  # each half's rows together, as printed
    frame = frame.sort_values("half", key=lambda h: h.map(order_of), kind="stable").reset_index(drop=True)
    pick = frame[(frame["half"] == next(iter(split_halves))) & ~frame["method"].str.startswith("task vectors")]
    pick = pick.sort_values(["knn_score", "ref_corr", "dim"], ascending=[False, False, True], kind="stable")
    frame["selected"] = frame["method"] == pick["method"].iloc[0]
    columns = [
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
    ]
    return frame[[c for c in columns if c in frame.columns]]


def _coordinates(
    db: Store, base: str | None, representation: Representation, models: Sequence[str]
) -> tuple[np.ndarray, pd.DataFrame, int]:
    """The stored vectors of ``models`` as coordinates with the same inner products (from their products, read
    from the vector file in blocks: never the vectors themselves), their metadata and the vectors' dimension.
    Every model must be readable: a damaged vector is an error naming it."""
    selection, meta = db.select(base=base, representation=representation, models=models)
    products = db.products(selection)
    if products.damaged:
        model, line = next(iter(products.damaged.items()))
        raise StoreError(model, line.removeprefix(f"{model}: "))
    return coordinates_of(products.gram), meta, selection.dim
