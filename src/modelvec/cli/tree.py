"""``modelvec tree``: The model tree of a stored base, inferred from the weights, beside what the cards declare."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from ..represent.representation import Representation
from .options import JsonOpt, StoreOpt, WaitOpt, with_settings
from .printing import console, notes, print_json, printable, say, short_name
from .shell import command, left_out, open_store

if TYPE_CHECKING:
    from ..analyse.tree import Node


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
    kind (fine-tune, adapter, merge, quantization, unrelated, a copy) with a confidence, from the weights alone; a
    model whose card declares otherwise is flagged. A model without a trace is named, with what to do.
    """
    from ..report.tree import model_tree

    with open_store(store, wait, read_only=True) as db:
        found = model_tree(base, representation=representation, store=db)
    if as_json:
        print_json(found.as_json())
        notes(found.notes + found.repaired)
        left_out(found.damaged)
        return
    from ..plots.tree import tree_figure

    figure = tree_figure(found, out / "tree.png")
    say(console, f"{short_name(found.base)} (base)")
    for node, depth in found.ordered():
        say(console, f"{'  ' * depth}{_line(node, found.base)}", hang="  " * depth + "    ")
    flagged = sum(not n.agrees for n in found.nodes)
    unrelated = sum(n.kind == "unrelated" for n in found.nodes)
    say(
        console,
        f"{len(found.nodes)} models: {unrelated} unrelated, {flagged} whose card the weights contradict; "
        f"figure: {short_name(str(figure))}",
    )
    if found.partial:
        untraced = sum(n.kind == "untraced" for n in found.nodes)
        say(
            console,
            f"the tree is partial: {untraced} of {len(found.nodes)} models have no trace, so the weights cannot place "
            "them, and a model placed above them may be their child (embed them again with --force)",
        )
    notes(found.notes + found.repaired)
    left_out(found.damaged)


def _line(node: Node, base: str) -> str:
    """One model of the tree as its line: its name, kind (a merge's parents and weights) and confidence, what is
    noted of it, and a card the weights contradict."""
    name = short_name(node.model)
    if node.kind == "untraced":
        line = f"{name}: untraced, {printable(node.note)}"
    elif node.copy_of is not None:
        what = "the base" if node.copy_of == base else short_name(node.copy_of)
        how = (
            f"a {node.resaved} re-save of {what} (equal up to rounding)"
            if node.resaved
            else f"a copy of {what} (identical weights)"
        )
        line = f"{name}: {how}" + (
            f"; {what}: the original, {node.original_by}" if node.original_by not in (None, "the base") else ""
        )
    elif node.kind == "merge":
        parts = " + ".join(f"{short_name(p)} {w:.2f}" for p, w in zip(node.parents, node.weights or []))
        how = f" ({printable(node.method)})" if node.method else ""
        line = f"{name}: merge{how} of {parts or ' + '.join(map(short_name, node.parents))} ({node.confidence:.2f})"
    else:
        types = f" {printable(node.quantized)}" if node.quantized and node.kind == "quantization" else ""
        line = f"{name}: {node.kind}{types} ({node.confidence:.2f})"
    if node.note is not None and node.kind != "untraced":
        line += f"; {printable(node.note)}"
    if not node.agrees:
        declared = ", ".join(short_name(p) for p in node.declared_parents) or "nothing"
        said = f"{printable(node.declared_relation)} of" if node.declared_relation else "a derivative of"
        line += f"; its card says {said} {declared}"
    return line
