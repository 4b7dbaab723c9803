"""Running the work over many models: discovery wired to the readers, the pipeline, and its engines.

The pipeline (:func:`embed`) decides what needs computing, hands tasks to an engine (local threads
or a Ray cluster, picked by name from :data:`~modelvec.run.engines.ENGINES`) and writes what comes
back to the store as it arrives.
"""

from .discover import discover
from .engines import ENGINES, Engine, make_engine, register_engine
from .pipeline import EmbedResult, catalogue_entries, embed, embed_discovered, local_files
from .work import BaseSpec, Outcome, Task, compute

__all__ = [
    "ENGINES",
    "BaseSpec",
    "EmbedResult",
    "Engine",
    "Outcome",
    "Task",
    "catalogue_entries",
    "compute",
    "discover",
    "embed",
    "embed_discovered",
    "local_files",
    "make_engine",
    "register_engine",
]
