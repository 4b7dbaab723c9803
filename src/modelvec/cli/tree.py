"""``modelvec tree``: The model tree of a stored base, inferred from the weights, beside what the cards declare."""

from __future__ import annotations

from pathlib import Path

import typer

from ..represent.representation import Representation
from .common import JsonOpt, StoreOpt, WaitOpt, command, console, open_store, print_json, say, short_name, with_settings


@command()
@with_settings(Representation, "representation")
def tree(
    base: str = typer.Argument(..., metavar="BASE", help="The stored base whose models are placed in the tree."),
    representation: Representation = None,  # type: ignore[assignment]  # its options: with_settings
    store: Path | None = StoreOpt,
    wait: float | None = WaitOpt,
    as_json: bool = JsonOpt,
    out: Path = typer.Option(Path("modelvec-out"), "--out", metavar="DIR", help="Folder for the tree's PNG."),
) -> None:
    """The model tree of BASE's stored models: each model's parent (the base, another stored model, or none) and
    kind (fine-tune, adapter, merge, quantization, unrelated) with a confidence, from the weights alone; a model
    whose card declares otherwise is flagged.
    """
    from ..report.tree import model_tree

    with open_store(store, wait, read_only=True) as db:
        found = model_tree(base, representation=representation, store=db)
    if as_json:
        print_json(found.as_json())
        return
    from ..plots.tree import tree_figure

    figure = tree_figure(found, out / "tree.png")
    say(console, f"{short_name(found.base)} (base)")
    for node, depth in found.ordered():
        what = (
            node.kind
            if node.kind != "merge"
            else "merge of " + " + ".join(f"{short_name(p)} {w:.2f}" for p, w in zip(node.parents, node.weights or []))
        )
        line = f"{'  ' * depth}{short_name(node.model)}: {what} ({node.confidence:.2f})"
        if node.copy_of is not None:
            line = f"{'  ' * depth}{short_name(node.model)}: a copy of {short_name(node.copy_of)} (identical weights)"
        if not node.agrees:
            declared = ", ".join(short_name(p) for p in node.declared_parents) or "nothing"
            line += f"; its card says {node.declared_relation} of {declared}"
        say(console, line, hang="  " * depth + "    ")
    flagged = sum(not n.agrees for n in found.nodes)
    unrelated = sum(n.kind == "unrelated" for n in found.nodes)
    say(
        console,
        f"{len(found.nodes)} models: {unrelated} unrelated, {flagged} whose card the weights contradict; "
        f"figure: {short_name(str(figure))}",
    )
