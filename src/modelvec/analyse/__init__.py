"""Pure analysis of vectors, arrays in and numbers out: the kNN dataset score and clustering scores, reduction
to 2-D maps, the scores of representations compared, evidence over halves of the datasets, fitted laws.

Nothing here reads a checkpoint, a store or the Hub (an import-linter contract says so): what runs over models
is :mod:`modelvec.studies`'.
"""

from __future__ import annotations

from .clustering import clustering_scores
from .laws import LAWS, Fit, fit_law, fit_laws
from .reduction import reduce
from .scores import (
    SCALINGS,
    Geometry,
    KnnScore,
    Predictions,
    Yardstick,
    distance_matrix,
    knn_dataset_score,
    majority_dataset,
    nearest,
    nearest_to,
    predict_datasets,
    query_distances,
    yardstick,
)

__all__ = [
    "LAWS",
    "SCALINGS",
    "Fit",
    "Geometry",
    "KnnScore",
    "Predictions",
    "Yardstick",
    "clustering_scores",
    "distance_matrix",
    "fit_law",
    "fit_laws",
    "knn_dataset_score",
    "majority_dataset",
    "nearest",
    "nearest_to",
    "predict_datasets",
    "query_distances",
    "reduce",
    "yardstick",
]
