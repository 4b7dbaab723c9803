"""modelvec: fine-tuned transformers as vectors, from their weight deltas.

The pipeline, one stage per module: ``architectures`` (which tensors play which role) ->
``checkpoint`` (read only those tensors) -> ``representation`` (deltas -> truncated SVD -> vector)
-> ``store`` (DuckDB) -> ``pipeline`` (many models, resume, failures) -> ``cli``.
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
]
__version__ = "0.1.0"
