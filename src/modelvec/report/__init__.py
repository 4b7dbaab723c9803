"""Reports: the cluster report (scores and maps), nearest neighbours of any model, the depth study written out."""

from .cluster import ClusterReport, cluster, load_base
from .depth import depth_report, write_outputs
from .neighbors import Neighbors, neighbors

__all__ = ["ClusterReport", "Neighbors", "cluster", "depth_report", "load_base", "neighbors", "write_outputs"]
