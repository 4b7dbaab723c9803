"""``modelvec rank``: How the rank of every matrix changes with depth: the ranks per threshold, laws where they fit, figures."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.table import Column, Table

from ..spectra.energy import Ranks
from .options import JsonOpt, StoreOpt, with_settings
from .printing import console, err, print_json, printable, say, short_name, whole_column
from .shell import command

if TYPE_CHECKING:
    from ..studies.depth import DepthStudy

#: The width the law column keeps beside the ranks ("no law fits (best adj. R² -0.47)" in two lines).
_LAW_WIDTH = 18


@command()
@with_settings(Ranks, "ranks")
def rank(
    model: str | None = typer.Argument(
        None, metavar="MODEL", help="The model whose matrices to study (folder, weights file or .gguf)."
    ),
    base: Path | None = typer.Option(None, "--base", metavar="BASE", help="The base, for --of delta."),
    ranks: Ranks = None,  # type: ignore[assignment]  # its options: with_settings
    over_finetunes: str | None = typer.Option(
        None, "--over-finetunes", metavar="BASE", help="Study the deltas of every stored fine-tune of BASE."
    ),
    out: Path = typer.Option(
        Path("modelvec-out/rank"), "--out", metavar="DIR", help="Folder for the figures, CSV and JSON."
    ),
    as_json: bool = JsonOpt,
    store: Path | None = StoreOpt,
) -> None:
    """How the rank of every matrix changes with depth: the ranks per threshold, laws where they fit, figures."""
    from ..report import depth_report

    study = depth_report(model, ranks, base=base, over_finetunes=over_finetunes, store=store, out=out)
    for reason in study.failed.values():
        say(err, f"failed: {printable(reason)}")
    for warning in study.warnings:
        say(err, f"warning: {printable(warning)}")
    for note in study.notes:
        say(err, f"note: {printable(note)}")
    if as_json:
        print_json(study.records())
        return
    show_ranks(study, console)
    for kind, path in study.files.items():
        say(console, f"{kind}: {printable(path)}")


def show_ranks(study: DepthStudy, out: Console) -> None:
    """Per threshold, a table of the ranks at layers 1..L of every (stack, family) and its law where one
    fits (:func:`modelvec.analyse.laws.shown_law`); below it, each shown law's equation on a line of its own."""
    from ..analyse.laws import MIN_ADJ_R2, shown_law
    from ..spectra.tables import ranks_across_depth

    matrix = "ΔW" if study.of == "delta" else "W"
    mean = "mean " if study.n_models > 1 else ""
    values = ranks_across_depth(study.table)
    texts = {key: [_value(v, bool(mean)) for v in seq] for key, seq in values.items()}
    stacks = list(dict.fromkeys(key[0] for key in values))
    many = len(stacks) > 1  # one stack: named once above the tables, not on every row
    where = "" if many or not stacks else f" of the {stacks[0]}"
    say(out, f"{mean}rank of {matrix} across depth{where}: {short_name(study.model)}")
    for t in sorted({key[2] for key in values}):
        keys = [key for key in values if key[2] == t]
        width = max((len(v) for k in keys for v in texts[k]), default=1)  # every value as wide: columns align
        names = [("stack", [k[0] for k in keys])] if many else []
        names.append(("family", [k[1] for k in keys]))
        frame = 1 + 3 * (len(names) + 2)  # rich's default box: a border and a space either side of every column
        room = out.width - frame - sum(max(len(h), *map(len, col)) for h, col in names) - _LAW_WIDTH
        per_line = _per_line(max(len(texts[k]) for k in keys), width, room)
        shown = {key: shown_law(study.fits.get(key, [])) for key in keys}
        below = "; equations below" if any(law is not None for law, _ in shown.values()) else ""
        table = Table(
            *(h for h, _ in names),
            Column(f"{mean}rank at layers 1, 2, …", overflow="fold", min_width=min(per_line * (width + 1) - 1, room)),
            whole_column("law"),
            title=f"threshold {t:g}: the smallest r with Σᵢ≤ᵣ σᵢ² ≥ {t:g}·Σ σᵢ² of {matrix}",
            caption=f"law: the best by adjusted R², where that is ≥ {MIN_ADJ_R2:g}{below}",
        )
        equations = []
        for key in keys:
            stack, family, _ = key
            law, verdict = shown[key]
            table.add_row(*([stack] if many else []), family, _lines(texts[key], width, per_line), verdict)
            if law is not None:
                name = f"{stack} {family}" if many else family
                equations.append(f"{name}, threshold {t:g}: {law.equation}  ({verdict})")
        out.print(table)
        for line in equations:
            _say_wrapped(out, line)


def _value(v: float | None, mean: bool = False) -> str:
    """A rank as printed: whole, or a mean to one decimal (every mean, so that a column of them reads alike);
    '-' where the family has no matrix."""
    if v is None:
        return "-"
    return f"{v:.1f}" if mean or not float(v).is_integer() else str(int(v))


def _per_line(n: int, width: int, room: int) -> int:
    """How many values of ``width`` characters a line of the ranks column holds: all, or what fits in ``room``
    rounded down to a multiple of 5 (so each line starts at layer 1, 6, 11, … or 1, 11, 21, …)."""
    fits = max(1, (room + 1) // (width + 1))
    if fits >= n:
        return n
    return fits - fits % 5 if fits >= 5 else fits


def _lines(values: list[str], width: int, per_line: int) -> str:
    """The values right-aligned to ``width``, ``per_line`` a line; they break at spaces, never inside a number."""
    cells = [v.rjust(width) for v in values]
    return "\n".join(" ".join(cells[i : i + per_line]) for i in range(0, len(cells), per_line))


def _say_wrapped(out: Console, text: str) -> None:
    """One line, whole, where it is read by a program (a pipe, a file); in a terminal, wrapped by rich at spaces
    (a terminal's own wrap would cut a number in two)."""
    out.print(text, soft_wrap=not out.is_terminal, markup=False, highlight=False)
