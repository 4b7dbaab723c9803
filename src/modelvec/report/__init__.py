"""Reports: the cluster report (scores and maps), nearest neighbours of any model, the depth study written out.

The depth study is loaded when first used: it needs torch, which ``cluster`` and ``neighbors`` of stored
vectors do not."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.lazy import lazy_exports
from .cluster import ClusterReport, cluster, load_base
from .neighbors import Neighbors, neighbors

if TYPE_CHECKING:
    from .depth import depth_report, write_outputs

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {"depth": ("depth_report", "write_outputs")},
    eager=("ClusterReport", "Neighbors", "cluster", "load_base", "neighbors"),
)
