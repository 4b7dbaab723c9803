"""The model tree's figure: each model under its parent, coloured by the kind its weights say, a merge joined to
every parent, a model whose card says otherwise ringed."""

from __future__ import annotations

from pathlib import Path

from ..analyse.tree import Tree
from ..core.names import display_name
from ..core.output import write_atomically
from .maps.groups import KIND_COLOURS
from .text import figure_text

#: Models up to which each is named in the figure (beyond, the tree's shape and colours; ``tree --json`` and the
#: indented list name them all).
LABELLED_UP_TO = 300


def tree_figure(tree: Tree, path: str | Path) -> Path:
    """Draw ``tree`` as an indented tree (depth across, one row per model) into a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ordered = tree.ordered()
    rows = {node.model: i + 1 for i, (node, _) in enumerate(ordered)}
    depth_of = {node.model: depth for node, depth in ordered}
    fig, ax = plt.subplots(figsize=(9, max(2.5, 0.28 * (min(len(ordered), LABELLED_UP_TO) + 2))))
    ax.scatter([0], [0], s=80, color="black", zorder=3)
    ax.annotate(
        figure_text(display_name(tree.base)) + "  (base)",
        (0, 0),
        xytext=(8, 0),
        textcoords="offset points",
        va="center",
    )
    from matplotlib.collections import LineCollection

    segments: dict[str, list] = {"-": [], "--": []}  # one collection per line style: thousands of models draw fast
    points: dict[str, list[tuple[int, int]]] = {kind: [] for kind in KIND_COLOURS}
    for node, depth in ordered:
        y, x = rows[node.model], depth
        for parent in node.parents:
            px, py = (0, 0) if parent == tree.base else (depth_of.get(parent, 0), rows.get(parent, 0))
            segments["--" if node.kind == "merge" else "-"].append([(px, py), (px, y), (x, y)])
        points[node.kind].append((x, y))
        if not node.agrees:
            ax.scatter([x], [y], s=90, facecolors="none", edgecolors="red", lw=1.5, zorder=4)
        if len(ordered) <= LABELLED_UP_TO:
            label = f"{figure_text(display_name(node.model))}  {node.kind} {node.confidence:.2f}"
            label += "  (card disagrees)" if not node.agrees else ""
            ax.annotate(label, (x, y), xytext=(8, 0), textcoords="offset points", va="center", fontsize=8)
    for style, lines in segments.items():
        ax.add_collection(LineCollection(lines, colors="0.6", linewidths=0.8, linestyles=style, zorder=1))
    for kind, xy in points.items():
        if xy:
            xs, ys = zip(*xy)
            ax.scatter(xs, ys, s=50 if len(ordered) <= LABELLED_UP_TO else 8, color=KIND_COLOURS[kind], zorder=3)
    for kind, colour in KIND_COLOURS.items():
        ax.scatter([], [], color=colour, label=kind)
    ax.legend(loc="upper right", fontsize=8, frameon=False)
    ax.invert_yaxis()
    ax.set_xlim(-0.3, max([d for _, d in ordered] + [1]) + 3)
    ax.axis("off")
    ax.set_title(f"model tree of {figure_text(display_name(tree.base))}, inferred from the weights", fontsize=10)
    fig.tight_layout()
    try:
        return write_atomically(Path(path), lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    finally:
        plt.close(fig)
