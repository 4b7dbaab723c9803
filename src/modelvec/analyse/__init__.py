"""Analysing vectors: the kNN dataset score and clustering scores, maps, representations compared, fitted laws.

``evaluate`` embeds models (torch), so it is imported when first used.
"""

from __future__ import annotations

from typing import Any

from .laws import LAWS, Fit, fit_law, fit_laws
from .maps import reduce
from .scores import (
    SCALINGS,
    KnnScore,
    Predictions,
    clustering_scores,
    distance_matrix,
    knn_dataset_score,
    majority_dataset,
    nearest,
    predict_datasets,
)

__all__ = [
    "LAWS",
    "SCALINGS",
    "Fit",
    "KnnScore",
    "Predictions",
    "clustering_scores",
    "distance_matrix",
    "evaluate",
    "fit_law",
    "fit_laws",
    "knn_dataset_score",
    "majority_dataset",
    "nearest",
    "predict_datasets",
    "reduce",
]


def __getattr__(name: str) -> Any:
    """``evaluate`` (which embeds, with torch) is imported on first use."""
    if name == "evaluate":
        from .evaluation import evaluate

        return evaluate
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
