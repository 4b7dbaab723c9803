"""modelvec: fine-tuned transformers as vectors, from their weight deltas.

The pipeline, one stage per module: ``architectures`` (which tensors play which role) ->
``checkpoint`` (read only those tensors) -> ``representation`` (deltas -> truncated SVD -> vector)
-> ``store`` (DuckDB) -> ``pipeline`` (many models, resume, failures) -> ``analysis`` (kNN dataset
score, predictions, clustering scores) -> ``maps`` / ``plots`` -> ``report`` (cluster, neighbours)
and ``evaluation`` (representations compared) -> ``cli``.
"""

from .architectures import ARCHITECTURES, Architecture, detect
from .checkpoint import Checkpoint
from .errors import ArchitectureError, CheckpointError, IncompatibleError, ModelvecError
from .pipeline import EmbedResult, embed
from .representation import DeltaEmbedder, Representation
from .store import Store

__all__ = [
    "ARCHITECTURES",
    "Architecture",
    "ArchitectureError",
    "Checkpoint",
    "CheckpointError",
    "DeltaEmbedder",
    "EmbedResult",
    "IncompatibleError",
    "ModelvecError",
    "Representation",
    "Store",
    "detect",
    "embed",
    "cluster",
    "neighbors",
    "evaluate",
]
__version__ = "0.1.0"

_LAZY = {"cluster": "report", "neighbors": "report", "evaluate": "evaluation"}


def __getattr__(name: str):
    """``modelvec.cluster``, ``neighbors`` and ``evaluate`` import the plotting stack only when used."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'modelvec' has no attribute {name!r}")
