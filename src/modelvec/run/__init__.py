"""Running the work over many models: discovery wired to the readers, the pipeline, and its engines.

The pipeline (:func:`embed`) decides what needs computing, hands tasks to an engine (local threads
or a Ray cluster, picked by name from :data:`~modelvec.run.engines.ENGINES`) and writes what comes
back to the store as it arrives.
"""

from .discover import catalogue_entries, discover
from .engines import ENGINES, Engine, make_engine, register_engine
from .ledger import EmbedResult, Step
from .pipeline import embed, embed_discovered
from .tasks import local_files
from .work import BaseSpec, Opened, Outcome, Task, compute, open_counted

__all__ = [
    "ENGINES",
    "BaseSpec",
    "EmbedResult",
    "Engine",
    "Opened",
    "Outcome",
    "Step",
    "Task",
    "catalogue_entries",
    "compute",
    "discover",
    "embed",
    "embed_discovered",
    "local_files",
    "make_engine",
    "open_counted",
    "register_engine",
]
