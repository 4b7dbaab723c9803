"""``modelvec embed``: Embed fine-tunes into the store (skips what is stored; records failures and goes on)."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from ..core.tree import Scope
from ..represent.representation import Representation
from ..run.engines import Execution
from .options import JsonOpt, StoreOpt, WaitOpt, with_settings
from .printing import console, err, print_json, printable, say, short_name
from .shell import EXIT_SOME_FAILED, command, open_store

if TYPE_CHECKING:
    from rich.progress import Progress, ProgressColumn

    from ..run import EmbedResult, Step

TargetsArg = typer.Argument(
    ...,
    metavar="MODEL",
    help="Fine-tunes (folders, weight files or Hub ids) with --base; "
    "or just BASE (a Hub id): every discovered fine-tune of it.",
)
BaseOpt = typer.Option(
    None, "--base", metavar="BASE", help="The base model the fine-tunes start from (path or Hub id)."
)
ForceOpt = typer.Option(False, "--force", help="Recompute models already stored.")
RefreshOpt = typer.Option(False, "--refresh", help="BASE mode: run discovery again before embedding.")
#: discovery's settings as embed BASE uses them
SCOPE_HELPS = {"limit": "BASE mode: at most this many fine-tunes.", "sort": "BASE mode: which first."}
_clock = time.monotonic  # the progress line's clock (a test sets its own)


@command()
@with_settings(Representation, "representation")
@with_settings(Execution, "execution")
@with_settings(Scope, "scope", only=("limit", "sort"), helps=SCOPE_HELPS)
def embed(
    targets: list[str] = TargetsArg,
    base: str | None = BaseOpt,
    representation: Representation = None,  # type: ignore[assignment]  # its options: with_settings
    execution: Execution = None,  # type: ignore[assignment]  # its options: with_settings
    store: Path | None = StoreOpt,
    force: bool = ForceOpt,
    scope: Scope = None,  # type: ignore[assignment]  # its options: with_settings
    refresh: bool = RefreshOpt,
    wait: float | None = WaitOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Embed fine-tunes into the store (skips what is stored; records failures and goes on; exit status 1 when some
    models failed).

    `modelvec embed --base BASE MODEL...` embeds the given models; `modelvec embed BASE` embeds
    every fine-tune of the Hub model BASE found by `modelvec discover` (run first when needed).
    In a terminal, one line shows the models done of all, the bytes fetched from the Hub and the time left.
    """
    from ..run import embed as embed_models
    from ..run import embed_discovered

    if base is None and len(targets) != 1:
        raise typer.BadParameter(
            "give --base BASE with the models, or a single BASE to embed its discovered fine-tunes"
        )
    from ..represent import resolve_device

    resolve_device(execution.device)  # torch loaded before the store is taken: another process waits less
    with open_store(store, wait) as db, ProgressLine(discovering=base is None, quiet=as_json) as on_step:
        common: dict[str, Any] = dict(
            representation=representation,
            execution=execution,
            store=db,
            force=force,
            on_step=on_step,
            load=False,
        )
        if base is None:
            result = embed_discovered(targets[0], scope, refresh=refresh, **common)
        else:
            result = embed_models(base, targets, **common)
    _report(result, str(db.path), as_json)


def _report(result: EmbedResult, store: str, as_json: bool) -> None:
    """What the run did: JSON, or the notes, one line per failure and the summary; exit 1 when some models failed."""
    if as_json:
        print_json(result.as_json())
    else:
        for note, names in result.notes.items():
            say(err, f"note: {_note_line(note, names)}")
        for alias, model in result.aliases.items():
            say(err, f"note: {short_name(alias)}: the same weight files as {short_name(model)}: one model, stored once")
        for model, other in result.same_weights.items():
            say(
                err,
                f"note: {short_name(model)}: the same weights as {short_name(other)} (a copy): counted once in every "
                "report, as the original (`modelvec tree` says which)",
            )
        for name, reason in result.failed.items():  # the model named as typed: a local folder relative to here
            say(console, f"  failed: {_named(name, reason)}")
        say(
            console,
            f"embedded {len(result.embedded)}, skipped {len(result.skipped)} (already stored), "
            f"failed {len(result.failed)} -> {printable(store)}",
        )
        if result.kept_products:
            say(err, f"note: {printable(result.kept_products)}")
    if result.failed:  # exit 1: some models failed; the last line says which kind
        new = len(result.failed) - len(result.recorded)
        said = f"{new} new" + (
            f", {len(result.recorded)} recorded by an earlier run (--force tries again)" if result.recorded else ""
        )
        total = len(result.failed) + len(result.embedded) + len(result.skipped)
        say(err, f"some models failed: {len(result.failed)} of {total} ({said})")
        raise typer.Exit(EXIT_SOME_FAILED)


def _named(name: str, line: str) -> str:
    """A line about one model that starts with its stored name, as printed: the model as typed (a local folder
    relative to here), the line escaped where it is not printable (:func:`~modelvec.cli.printing.printable`)."""
    return short_name(name) + printable(line[len(name) :]) if line.startswith(name) else printable(line)


def _note_line(note: str, names: list[str]) -> str:
    """A note of the run as printed: one that names its one model (a card that could not be read) as it is, the
    others with how many models they concern and the first."""
    if len(names) == 1 and note.startswith(names[0]):
        return _named(names[0], note)
    return f"{printable(note)} ({len(names)} model{'s' if len(names) > 1 else ''}, e.g. {short_name(names[0])})"


class ProgressLine:
    """One line on stderr that updates in place: models done of all, bytes fetched from the Hub, time left.

    The time left counts only the models that were computed (or failed) so far, not the ones skipped as stored,
    so a resumed run does not promise to finish at the speed of its skips. Nothing is drawn with ``quiet``
    (``--json``), and outside a terminal only the last state is printed, once.
    """

    def __init__(self, *, discovering: bool, quiet: bool) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        fetched, left = _columns()
        columns = (
            TextColumn("{task.description}"),
            BarColumn(bar_width=20),
            MofNCompleteColumn(),
            fetched,
            left,
            TimeElapsedColumn(),
        )
        self.bar: Progress = Progress(*columns, console=err, transient=False, disable=quiet)
        self.task = self.bar.add_task("discovering" if discovering else "embedding", total=None, fetched=0, worked=0)
        self.began: float | None = None

    def __enter__(self) -> Callable[[Step], None]:
        self.bar.__enter__()
        return self.step

    def __exit__(self, *exc: object) -> None:
        self.bar.__exit__(None, None, None)

    def step(self, step: Step) -> None:
        """A :class:`~modelvec.run.Step` of the run: the total first, then one model at a time."""
        fields = self.bar.tasks[0].fields
        if step.status == "begin":
            self.began = _clock()
            self.bar.update(self.task, description="embedding", total=step.total, began=self.began)
            return
        if step.status == "keeping":  # after the last model: the products for the map, which may take a while
            self.bar.update(self.task, description="keeping products")
            return
        worked = fields["worked"] + (step.status != "skipped")
        self.bar.update(self.task, advance=1, fetched=fields["fetched"] + step.fetched, worked=worked)


def _columns() -> tuple[ProgressColumn, ProgressColumn]:
    """The bytes fetched so far, and the time left at the pace of the models computed so far."""
    from rich.filesize import decimal
    from rich.progress import ProgressColumn, Task
    from rich.text import Text

    class Fetched(ProgressColumn):
        def render(self, task: Task) -> Text:
            return Text(f"{decimal(int(task.fields.get('fetched', 0)))} fetched", style="progress.filesize")

    class Left(ProgressColumn):
        def render(self, task: Task) -> Text:
            began, worked = task.fields.get("began"), int(task.fields.get("worked", 0))
            if task.total is None or began is None or worked == 0:
                return Text("ETA -:--:--", style="progress.remaining")
            seconds = (task.total - task.completed) * (_clock() - began) / worked
            return Text(f"ETA {timedelta(seconds=round(seconds))}", style="progress.remaining")

    return Fetched(), Left()
