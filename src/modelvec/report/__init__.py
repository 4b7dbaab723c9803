"""Reports: the cluster report (scores and maps), nearest neighbours of any model, the depth study written out.

Each report is loaded when first used, so a command imports only its own (``rank`` none of the cluster
report's maps and stores)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.lazy import lazy_exports

if TYPE_CHECKING:
    from .clusters import ClusterReport, cluster
    from .depth import depth_report, write_outputs
    from .nearest import Neighbors, neighbors

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "clusters": ("ClusterReport", "cluster"),
        "depth": ("depth_report", "write_outputs"),
        "nearest": ("Neighbors", "neighbors"),
    },
)
