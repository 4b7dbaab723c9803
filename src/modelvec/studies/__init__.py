"""Studies over models: the orchestration above the pure analysis.

``compare`` (``evaluate``) embeds models every way (``grid``'s variants, through :mod:`modelvec.run` and the store) and
forms their exact task vectors from their checkpoints (``task_vectors``), then scores them with
:mod:`modelvec.analyse.evaluation`; ``spectra`` reads every
matrix's squared singular values from a checkpoint, and ``depth`` turns them into the depth study, whose
mathematics is :mod:`modelvec.spectra`'s. Each is loaded when first used: ``compare`` imports torch, ``spectra``
and ``depth`` on the CPU only numpy (torch for a GPU, ``.bin`` and GGUF files).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.lazy import lazy_exports

if TYPE_CHECKING:
    from .compare import evaluate
    from .depth import DepthStudy, depth_study, over_finetunes, over_stored
    from .grid import VARIANTS, variants
    from .spectra import spectra_of
    from .sweep import Sweep
    from .task_vectors import task_vector_gram

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "depth": ("DepthStudy", "depth_study", "over_finetunes", "over_stored"),
        "spectra": ("spectra_of",),
        "compare": ("evaluate",),
        "grid": ("VARIANTS", "variants"),
        "task_vectors": ("task_vector_gram",),
        "sweep": ("Sweep",),
    },
)
