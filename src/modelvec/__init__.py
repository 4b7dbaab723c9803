"""modelvec: fine-tuned transformers as vectors, from their weight deltas.

One package per stage, in the order the data flows (imports only go down this list, which an
import-linter contract checks):

- ``core``: the error model, model names, the files that make a model;
- ``hub`` and ``read``: find and fetch models on the Hugging Face Hub; read only the tensors that
  play a role (architectures as data; safetensors, ``.bin``, LoRA adapters, GGUF);
- ``represent``: deltas -> vector (:class:`Representation`, :class:`DeltaEmbedder`);
- ``store``: the DuckDB store and the vector file;
- ``run``: many models through engines (local threads, Ray), resume, failures;
- ``analyse``: kNN dataset score, clustering scores, maps, representations compared, fitted laws;
- ``rank``: the rank study; ``plots`` and ``report``: pictures and reports; ``cli``: the commands.

Every public name below is imported on first use (as huggingface_hub does), so ``import modelvec``
is instant and loads torch only when something needs it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: public name -> the module that defines it
_LAZY: dict[str, str] = {
    "ARCHITECTURES": "read",
    "Architecture": "read",
    "Checkpoint": "read",
    "detect": "read",
    "open_checkpoint": "read",
    "ArchitectureError": "core",
    "CheckpointError": "core",
    "FetchError": "core",
    "IncompatibleError": "core",
    "Kind": "core",
    "ModelvecError": "core",
    "ResourceError": "core",
    "TransientError": "core",
    "error_of": "core",
    "DeltaEmbedder": "represent",
    "Representation": "represent",
    "Store": "store",
    "StoreError": "core",
    "StoreLockedError": "core",
    "NothingStoredError": "core",
    "EmbedResult": "run",
    "embed": "run",
    "embed_discovered": "run",
    "discover": "run",
    "evaluate": "analyse",
    "knn_dataset_score": "analyse",
    "reduce": "analyse",
    "rank_study": "rank",
    "RankStudy": "rank",
    "cluster": "report",
    "neighbors": "report",
    "rank_report": "report",
}

__all__ = sorted(_LAZY)

if TYPE_CHECKING:
    from .analyse import evaluate, knn_dataset_score, reduce
    from .core import (
        ArchitectureError,
        CheckpointError,
        FetchError,
        IncompatibleError,
        Kind,
        ModelvecError,
        NothingStoredError,
        ResourceError,
        StoreError,
        StoreLockedError,
        TransientError,
        error_of,
    )
    from .rank import RankStudy, rank_study
    from .read import ARCHITECTURES, Architecture, Checkpoint, detect, open_checkpoint
    from .report import cluster, neighbors, rank_report
    from .represent import DeltaEmbedder, Representation
    from .run import EmbedResult, discover, embed, embed_discovered
    from .store import Store


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'modelvec' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
