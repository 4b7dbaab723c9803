"""The model tree: which stored model derives from which, and how, told by the weights (docs/tree.md).

The inference lives here, pure like the rest of the analysis: the tree as data (:mod:`.nodes`: ``Node``, ``Tree``,
the kinds), its thresholds (:mod:`.rule`: ``TreeRule``, one settings object), the inference from the traces
(:mod:`.lineage`: ``infer_tree``), where the weights alone cannot place a model (:mod:`.placement`), merges
(:mod:`.merges`; a trimmed merge entry by entry: :mod:`.entries`) and copies (:mod:`.copies`).

The other stages hold only their own step of it: the trace each model leaves (:mod:`modelvec.represent.trace`), the
relations a card declares and how deep discovery goes (:mod:`modelvec.core.tree`), the copies rule fed from the
store (:mod:`modelvec.store.views.copies`), the report (:mod:`modelvec.report.tree`), its figure and the map's hover
(:mod:`modelvec.plots.tree`, :mod:`modelvec.plots.maps.tree_hover`) and the command (:mod:`modelvec.cli.tree`).
"""

from __future__ import annotations

from .copies import Copy
from .lineage import infer_tree
from .nodes import DECLARED_KIND, KINDS, Node, Tree
from .rule import TreeRule

__all__ = ["DECLARED_KIND", "KINDS", "Copy", "Node", "Tree", "TreeRule", "infer_tree"]
