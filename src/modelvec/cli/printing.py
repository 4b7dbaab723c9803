"""How the commands print: consoles as wide as their terminal or log, text from outside escaped where it is not
printable, messages wrapped at spaces, tables that fall back to one record per row, notes on stderr, a progress
bar, ``--json``."""

from __future__ import annotations

import os
import textwrap
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Column, Table

from ..core.errors import shown
from ..core.output import json_text

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

#: Width of output that is not a terminal (a pipe, a log): wide enough that no id or table row is folded.
LOG_WIDTH = 400


def _console(stderr: bool = False) -> Console:
    """A terminal's console as wide as the terminal; a pipe's or a log's as wide as its lines (``$COLUMNS``
    still rules): rich would fold every table at 80 columns, splitting model ids mid-name. Neither reads console
    markup nor emoji codes: a folder named ``[/x]`` or ``:fire:`` is printed as it is named, not styled or refused."""
    out = Console(stderr=stderr, markup=False, emoji=False)
    if out.is_terminal or os.environ.get("COLUMNS"):
        return out
    return Console(stderr=stderr, width=LOG_WIDTH, markup=False, emoji=False)


console = _console()
err = _console(stderr=True)


def printable(text: object) -> str:
    """Text from outside modelvec (a model's name or path, a dataset, an author, a card's words, an error, a note
    naming them) as every printer shows it to people: as it is where printable, else escaped as Python writes it
    (``'a\\nb'``, ``'\\x1b[31m'``; :func:`~modelvec.core.errors.shown`), so that a folder's name can neither break a
    line nor drive the terminal. ``--json`` prints the exact text."""
    return shown(text if isinstance(text, str) else str(text), None)


def say(console_: Console, text: str, hang: str = "") -> None:
    """One message as written: in a terminal wrapped at spaces (never inside a name; continued lines start with
    ``hang``, e.g. an indented list's indent), in a pipe or log whole."""
    if console_.is_terminal:
        text = "\n".join(
            "\n".join(
                textwrap.wrap(
                    part,
                    console_.width,
                    break_on_hyphens=False,
                    break_long_words=True,
                    subsequent_indent=hang,
                    drop_whitespace=True,
                )
            )
            or part
            for part in text.split("\n")
        )
    console_.print(text, soft_wrap=True, markup=False, highlight=False)


def notes(lines: list[str]) -> None:
    """What a report left out of the stored population and why, and the kept files that did not verify and were
    computed again: one line each on stderr (the answer on stdout is the same as without them)."""
    for line in lines:
        say(err, f"note: {printable(line)}")


@contextmanager
def products_progress(enabled: bool = True) -> Iterator[Callable[[int, int], None]]:
    """A progress bar on stderr for the pairwise products of many vectors (minutes the first time at thousands
    of models; kept beside the store after): a callback ``(rows done, rows)``; nothing is drawn until it is called."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    columns = (TextColumn("pairwise products"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, console=err, transient=True, disable=not enabled) as bar:
        yield _ProductsBar(bar).update


class _ProductsBar:
    """The products' bar: its task is added at the first call, when the number of rows is known."""

    def __init__(self, bar: Progress) -> None:
        self.bar: Progress = bar
        self.task: TaskID | None = None

    def update(self, done: int, total: int) -> None:
        if self.task is None:
            self.task = self.bar.add_task("products", total=total)
        self.bar.update(self.task, completed=done)


def whole_column(header: str) -> Column:
    """A column whose cells are read or copied whole (names, representation keys, equations): wrapped, never cut."""
    return Column(header, overflow="fold", min_width=max(len(word) for word in header.split()))


def print_table(out: Console, table: Table, key: int = 1) -> None:
    """``table`` as a table where it fits the width with no cell folded; else one record per row, so that no id is
    split mid-name in a narrow terminal: its first ``key`` cells on a line (each on its own where they do not fit
    together), then the others as
    ``header value`` pairs (a pair whose cell is empty left out)."""
    if out.measure(table, options=out.options.update_width(100_000)).maximum <= out.width:  # its unfolded width
        out.print(table)
        return

    def line(text: str, indent: str = "") -> None:  # wrapped at spaces; an id too long for the indent loses it
        wrapper = textwrap.TextWrapper(
            out.width, initial_indent=indent, subsequent_indent=indent, break_on_hyphens=False, break_long_words=False
        )
        lines = [x if len(x) <= out.width else x.lstrip() for x in wrapper.wrap(text)]
        say(out, "\n".join(textwrap.fill(x, out.width) if len(x) > out.width else x for x in lines))

    if table.title:
        line(f"{table.title}:")
    headers = [str(column.header) for column in table.columns]
    cells = [[str(cell) for cell in column.cells] for column in table.columns]
    for i in range(table.row_count):
        ids = [cells[c][i] for c in range(key)]
        for text in [" ".join(ids)] if len(" ".join(ids)) <= out.width else ids:  # each id whole on its own line
            line(text)
        pairs = [f"{headers[c]} {cells[c][i]}" for c in range(key, len(headers)) if cells[c][i]]  # an empty cell: none
        line(" · ".join(pairs), indent="    ")


def short_name(name: str) -> str:
    """A stored model or base as the user likely typed it, as printed (:func:`printable`): relative to the working
    folder when inside it."""
    try:
        return printable(Path(name).relative_to(Path.cwd()))
    except ValueError:
        return printable(name)


def print_json(value: Any) -> None:
    """Every command's ``--json``: strict JSON, an undefined score ``null``
    (:func:`~modelvec.core.output.json_text`), the names exactly as stored."""
    print(json_text(value))


def fmt(value: object) -> str:
    if isinstance(value, float):
        return "nan" if value != value else f"{value:.3f}"
    return str(value)


def how_near(closeness: float) -> str:
    """A prediction's closeness (:meth:`modelvec.analyse.Yardstick.closeness`) in words."""
    if closeness != closeness:
        return "too few labelled models to judge how near its neighbours are"
    if closeness >= 1.0:
        return "its nearest labelled model is as near as stored models are to theirs"
    if closeness >= 0.9:  # within a tenth of the way from typical to unrelated: typical, not "farther"
        return "its nearest labelled model is about as near as stored models are to theirs"
    if closeness >= 0.5:
        return "its neighbours are farther than stored models usually are from theirs"
    return "its neighbours are far: hardly nearer than unrelated stored models are to each other"
