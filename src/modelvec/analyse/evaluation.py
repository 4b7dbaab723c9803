"""Which representation? The same models embedded every way and scored side by side.

Every variant goes through the store (so a re-run only scores), and is compared with the exact
reference: the cosine between whole flattened deltas (task vectors) over the same matrices,
computed streaming, one tensor of all models at a time, never holding all deltas in memory.
``ref_corr`` is the Pearson correlation between a variant's pairwise cosine similarities and the
reference's: 1.0 means the variant sees the same geometry as the full deltas.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from ..core.names import model_id
from ..read import Checkpoint
from ..represent.params import Representation
from ..run import embed
from ..store import Store, opened
from .scores import clustering_scores, knn_dataset_score, predict_datasets

PathLike = str | os.PathLike[str]


def variants(ranks: Sequence[int] = (Representation.rank,)) -> dict[str, Representation]:
    """The representations compared, named by their parameters (:meth:`Representation.label`).

    The description's factors as the original study ran them (U, raw signs), with canonical signs,
    scaled by Σ, and the singular values alone; the sketch; each pooled by mean and (U·Σ, sketch)
    concatenated over layers; each with and without block normalisation; at every rank in ``ranks``.
    """
    grid = [
        dict(factor="U", sign="none"),
        dict(factor="U"),
        dict(factor="US", sign="none"),
        dict(factor="US"),
        dict(factor="US", pooling="concat"),
        dict(factor="sketch"),
        dict(factor="sketch", pooling="concat"),
        dict(factor="S"),
    ]
    out: dict[str, Representation] = {}
    for block_norm in (False, True):
        for rank in ranks:
            for fields in grid:
                params = Representation(rank=rank, block_norm=block_norm, **fields)  # type: ignore[arg-type]
                out[params.label()] = params
    return out


#: The default comparison: every variant at the default rank (16 distinct parameter sets).
VARIANTS: dict[str, Representation] = variants()
REFERENCE = "task vectors (exact reference)"


@dataclass
class TaskVectors:
    """Inner products of the flattened deltas of every pair of models (float64), and their size."""

    gram: np.ndarray
    dim: int
    seconds_per_model: float

    def embedding(self) -> np.ndarray:
        """Rows whose inner products are the Gram matrix (X X^T = G), for distance-based scores."""
        evals, evecs = np.linalg.eigh(self.gram)
        return (evecs * np.sqrt(np.clip(evals, 0, None))).astype(np.float64)


def task_vector_gram(base: PathLike, models: Sequence[PathLike]) -> TaskVectors:
    """G[i, j] = <dW_i, dW_j> over all representation matrices, one tensor of all models at a time."""
    start = time.perf_counter()
    base_ck = Checkpoint(base)
    base_layout = base_ck.layout()
    cks = [Checkpoint(m) for m in models]
    layouts = [ck.layout() for ck in cks]
    gram = np.zeros((len(cks), len(cks)))
    dim = 0
    for ref in base_layout.refs:
        w0 = base_ck.matrix(ref, base_layout.prefix)
        deltas = torch.stack([(ck.matrix(ref, lay.prefix) - w0).reshape(-1) for ck, lay in zip(cks, layouts)]).double()
        gram += (deltas @ deltas.T).numpy()
        dim += w0.numel()
    return TaskVectors(gram, dim, (time.perf_counter() - start) / max(len(cks), 1))


def _cosine_similarities(X: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(X, axis=1, keepdims=True)
    unit = np.divide(X, norms, out=np.zeros_like(X, dtype=np.float64), where=norms > 0)
    return unit @ unit.T


def score_row(
    name: str,
    X: np.ndarray,
    labels: Sequence[Sequence[str]],
    reference: np.ndarray | None,
    *,
    metric: str = "cosine",
    k: int = 5,
    seed: int = 0,
) -> dict[str, object]:
    """The scores of one representation's vectors against the labels (and the reference geometry)."""
    knn = knn_dataset_score(X, labels, metric=metric)
    pred = predict_datasets(X, labels, k=k, metric=metric)
    row: dict[str, object] = {
        "method": name,
        "knn_score": knn.score,
        "n_scored": knn.n_scored,
        "loo_accuracy": pred.loo_accuracy,
    }
    row.update(clustering_scores(X, labels, metric=metric, seed=seed))
    if reference is not None:
        iu = np.triu_indices(len(X), 1)
        row["ref_corr"] = float(np.corrcoef(_cosine_similarities(X)[iu], reference[iu])[0, 1])
    return row


def evaluate(
    base: PathLike,
    models: Sequence[PathLike],
    *,
    variants: dict[str, Representation] | None = None,
    store: Store | PathLike | None = None,
    metric: str = "cosine",
    k: int = 5,
    progress: Callable[[str], None] | None = None,
) -> pd.DataFrame:
    """Embed ``models`` with every variant (through the store) and score each; one row per method.

    Models that fail in any variant are left out of all rows, so every row scores the same set.
    Columns: method, params, dim, seconds_per_model, knn_score, n_scored, loo_accuracy,
    silhouette, kmeans_nmi, kmeans_ari, hdbscan_nmi, hdbscan_ari, n_clustered, ref_corr.
    """
    variants = variants or VARIANTS
    same: dict[str, str] = {}
    for name, params in variants.items():
        if params.key() in same:
            raise ValueError(f"variants {same[params.key()]!r} and {name!r} have the same parameters ({params.key()})")
        same[params.key()] = name
    say = progress or (lambda _msg: None)
    with opened(store) as db:
        results = {}
        for name, params in variants.items():
            say(f"embedding: {name}")
            result = embed(base, models, representation=params, store=db)
            results[name] = (params, result)
        ok = set.intersection(*(set(r.metadata["model"]) for _, r in results.values()))
        order = [model_id(m) for m in models if model_id(m) in ok]
        if len(order) < 3:
            raise ValueError(f"only {len(order)} models embedded in every variant; need at least 3 to score")
        say("reference: task vectors")
        tv = task_vector_gram(base, order)
        reference = _cosine_similarities(tv.embedding())
        rows = []
        first_meta = None
        for name, (params, result) in results.items():
            meta = result.metadata.set_index("model").loc[order]
            index = {m: i for i, m in enumerate(result.metadata["model"])}
            X = result.vectors[[index[m] for m in order]]
            first_meta = first_meta if first_meta is not None else meta
            labels = [list(d) for d in meta["datasets"]]
            row = score_row(name, X, labels, reference, metric=metric, k=k)
            row.update(params=params.key(), dim=X.shape[1], seconds_per_model=float(meta["seconds"].median()))
            rows.append(row)
        assert first_meta is not None  # at least 3 models were scored above
        labels = [list(d) for d in first_meta["datasets"]]
        row = score_row(REFERENCE, tv.embedding(), labels, reference, metric=metric, k=k)
        row.update(params="full deltas", dim=tv.dim, seconds_per_model=tv.seconds_per_model)
        rows.append(row)
    columns = [
        "method",
        "params",
        "dim",
        "seconds_per_model",
        "knn_score",
        "n_scored",
        "loo_accuracy",
        "silhouette",
        "kmeans_nmi",
        "kmeans_ari",
        "hdbscan_nmi",
        "hdbscan_ari",
        "n_clustered",
        "ref_corr",
    ]
    frame = pd.DataFrame(rows)
    return frame[[c for c in columns if c in frame.columns]]
