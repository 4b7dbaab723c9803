"""modelvec: fine-tuned transformers as vectors, from their weight deltas.

One package per stage, in the order the data flows (imports only go down this list, which an
import-linter contract checks):

- ``core``: the error model, model names, the files that make a model;
- ``hub`` and ``read``: find and fetch models on the Hugging Face Hub; read only the tensors that
  play a role (architectures as data; safetensors, ``.bin``, LoRA adapters, GGUF);
- ``represent``: deltas -> vector (:class:`Representation`, :class:`DeltaEmbedder`);
- ``store``: the DuckDB store and the vector file;
- ``run``: many models through engines (local threads, Ray), resume, failures;
- ``analyse`` and ``spectra``: pure analysis, arrays in, numbers out (kNN dataset score, clustering scores,
  reduction to 2-D, scores of representations, fitted laws; energy ranks across depth);
- ``studies``: what runs over models (representations compared; the depth study of checkpoints);
- ``plots`` and ``report``: pictures and reports; ``cli``: the commands.

Every public name below is imported on first use (as huggingface_hub does), so ``import modelvec``
is instant and loads torch only when something needs it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .core.lazy import lazy_exports

__version__ = "0.1.0"

if TYPE_CHECKING:
    from .analyse import knn_dataset_score, reduce
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
    from .read import ARCHITECTURES, Architecture, Checkpoint, detect, open_checkpoint
    from .report import cluster, depth_report, neighbors
    from .represent import DeltaEmbedder, Representation
    from .run import EmbedResult, discover, embed, embed_discovered
    from .store import Store
    from .studies import DepthStudy, depth_study, evaluate

#: the public names, by the subpackage that defines them (imported on first use)
__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "analyse": ("knn_dataset_score", "reduce"),
        "core": (
            "ArchitectureError",
            "CheckpointError",
            "FetchError",
            "IncompatibleError",
            "Kind",
            "ModelvecError",
            "NothingStoredError",
            "ResourceError",
            "StoreError",
            "StoreLockedError",
            "TransientError",
            "error_of",
        ),
        "read": ("ARCHITECTURES", "Architecture", "Checkpoint", "detect", "open_checkpoint"),
        "report": ("cluster", "depth_report", "neighbors"),
        "represent": ("DeltaEmbedder", "Representation"),
        "run": ("EmbedResult", "discover", "embed", "embed_discovered"),
        "store": ("Store",),
        "studies": ("DepthStudy", "depth_study", "evaluate"),
    },
)
