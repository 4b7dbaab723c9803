"""What every stage shares: the error model, model names, and the file names that make a model."""

from .errors import (
    ArchitectureError,
    CheckpointError,
    FetchError,
    IncompatibleError,
    Kind,
    ModelvecError,
    ResourceError,
    TransientError,
    error_of,
    reason,
)
from .names import display_name, is_hub_id, model_id

__all__ = [
    "ArchitectureError",
    "CheckpointError",
    "FetchError",
    "IncompatibleError",
    "Kind",
    "ModelvecError",
    "ResourceError",
    "TransientError",
    "display_name",
    "error_of",
    "is_hub_id",
    "model_id",
    "reason",
]
