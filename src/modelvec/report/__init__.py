"""Reports: the cluster report (scores and maps), nearest neighbours of any model, the rank study written out."""

from .cluster import ClusterReport, cluster, load_base
from .neighbors import Neighbors, neighbors
from .rank import rank_report, write_outputs

__all__ = ["ClusterReport", "Neighbors", "cluster", "load_base", "neighbors", "rank_report", "write_outputs"]
