"""Studies over models: the orchestration above the pure analysis.

``compare`` (``evaluate``) embeds models every way (through :mod:`modelvec.run` and the store) and forms their exact task
vectors from their checkpoints, then scores them with :mod:`modelvec.analyse.evaluation`; ``depth`` reads
the matrices of checkpoints (local, stored or from the Hub) for the depth study, whose mathematics is
:mod:`modelvec.spectra`'s. Both import torch, so they are loaded when first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.lazy import lazy_exports

if TYPE_CHECKING:
    from .compare import VARIANTS, evaluate, task_vector_gram, variants
    from .depth import DepthStudy, depth_study, over_finetunes, over_stored
    from .spectra import spectra_of

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "depth": ("DepthStudy", "depth_study", "over_finetunes", "over_stored"),
        "spectra": ("spectra_of",),
        "compare": ("VARIANTS", "evaluate", "task_vector_gram", "variants"),
    },
)
