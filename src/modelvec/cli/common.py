"""The command line's shared parts: the app and its one-line errors, the options every command has, printing.

Each command is a module of this package, a thin shell over one API call; this module holds what they share.
"""

from __future__ import annotations

import functools
import inspect
import os
import re
import textwrap
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import typer
from rich.console import Console
from rich.table import Column, Table
from typer.core import TyperGroup

from ..core import constants
from ..core.errors import ModelvecError, shown
from ..core.output import json_text
from ..core.settings import Setting, check_field, choices_of, flag_of, kind_of, parse_value, settings_of, value_text

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

    from ..store import Store

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


def left_out(damaged: dict[str, str]) -> None:
    """Each stored vector left out because its bytes do not match their checksum, one line each on stderr, and
    exit status 1 (the others were analysed)."""
    for line in damaged.values():
        say(err, f"left out: {printable(line)}")
    if damaged:
        raise typer.Exit(EXIT_SOME_FAILED)


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


#: Exit statuses, for scripts (``modelvec --help`` and docs/commands.md say them).
EXIT_DONE, EXIT_SOME_FAILED, EXIT_ERROR, EXIT_BUG = 0, 1, 2, 3
EXIT_STATUSES = (
    "Exit status: 0 all done; 1 some models failed (embed; its last line says which) or stored vectors were left "
    "out as damaged (cluster, neighbors, export); 2 a usage or environment "
    "error (a bad option, a store or output that cannot be used, a model that cannot be read), said in one line; "
    "3 a bug in modelvec, said in one line (MODELVEC_DEBUG=1 shows the traceback)."
)


class _OneLineErrors(TyperGroup):
    """Runs the command. Whatever stops it is one line on stderr, never a traceback: a user-facing failure (a bad
    option, a model or store that cannot be read, a file that cannot be written, a store that cannot be written on
    a full disk) exits with status 2, a bug with status 3 (``MODELVEC_DEBUG=1`` re-raises it, for the traceback).

    Each class of error is said here, once, for every command: ``ModelvecError`` and ``ValueError`` as they read;
    ``OSError`` as the file and the cause in words (:func:`_os_cause`); DuckDB's errors after the store opened (a
    write on a full disk, a damaged block) as the store's file and the cause (:func:`_store_of` names it)."""

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        name, command, rest = super().resolve_command(ctx, args)
        ctx.meta[_COMMAND_ARGS] = list(rest)  # which store a later DuckDB error is about, when no open_store said
        return name, command, rest

    def invoke(self, ctx: Any) -> Any:  # typer's own click Context
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort, typer.TyperException):  # typer's own: usage errors print themselves
            raise
        except (ModelvecError, ValueError) as exc:
            say(err, f"error: {printable(exc)}")
            raise typer.Exit(EXIT_ERROR) from None
        except OSError as exc:  # the machine or the file system: an output folder, a full disk, permissions
            where = f"{printable(exc.filename)}: " if exc.filename else ""
            say(err, f"error: {where}{_os_cause(exc)}")
            raise typer.Exit(EXIT_ERROR) from None
        except KeyboardInterrupt:
            say(err, "interrupted (what was stored is kept)")
            raise typer.Exit(130) from None
        except Exception as exc:
            if _is_store_failure(exc):  # DuckDB failed to read or write the open store: the disk, not modelvec
                from ..store.lock import store_error

                say(err, f"error: {printable(store_error(_store_of(ctx), exc))}")
                raise typer.Exit(EXIT_ERROR) from None
            if constants.debug():
                raise
            first = printable((str(exc).strip().splitlines() or [""])[0][:300])
            say(err, f"error: a bug in modelvec ({type(exc).__name__}: {first}); MODELVEC_DEBUG=1 shows the traceback")
            raise typer.Exit(EXIT_BUG) from None


class _PlainHelp(typer.core.TyperCommand):
    """A command whose --help names its arguments without typer's type tags (``<str>``, ``<list[str]>``): the
    metavars and choices say what to give."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            if isinstance(param, typer.core.TyperArgument):
                param.display_type_rich = lambda ctx: None  # type: ignore[method-assign]

    def get_help(self, ctx: Any) -> str:
        return re.sub(r"\{([A-Z][A-Z_.]*)\}", r"\1", super().get_help(ctx))  # usage: BASE, not {BASE}


def command() -> Any:
    """``@command()``: a modelvec command (``app.command`` with the plain help)."""
    return app.command(cls=_PlainHelp)


_COMMAND_ARGS = "modelvec.args"  # a key of the context's meta, shared by a command's contexts
_OPENED: ContextVar[Path | None] = ContextVar("modelvec_opened_store", default=None)  # the store open_store opened


def _os_cause(exc: OSError) -> str:
    """Why a file could not be read or written, in words (the file's name is said beside it)."""
    import errno

    name = exc.filename if isinstance(exc.filename, (str, os.PathLike)) else None
    if exc.errno == errno.EEXIST and name is not None and Path(name).exists() and not Path(name).is_dir():
        return "a file stands where a folder is needed (give a folder, or a path that does not exist yet)"
    if exc.errno == errno.ENOTDIR:
        return "a part of this path is a file, not a folder"
    words = {
        errno.ENOENT: "no such file or folder",
        errno.EACCES: "permission denied",
        errno.EROFS: "on a read-only file system: cannot be written here",
        errno.ENOSPC: "no space left on the device",
        errno.EDQUOT: "disk quota exceeded",
        errno.EISDIR: "a folder, not a file",
    }
    return words.get(exc.errno or -1) or (exc.strerror or str(exc)).lower()


def _is_store_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is DuckDB failing on the store's file (I/O, a full disk, a damaged block, a database it
    invalidated after a failed write) rather than modelvec's SQL being wrong (a bug: a binder, parser, catalog,
    conversion or constraint error)."""
    import sys

    duckdb = sys.modules.get("duckdb")  # not imported: no DuckDB error can have been raised
    if duckdb is None or not isinstance(exc, duckdb.Error):
        return False
    return not isinstance(
        exc, (duckdb.ProgrammingError, duckdb.DataError, duckdb.IntegrityError, duckdb.NotSupportedError)
    )


def _store_of(ctx: Any) -> str:
    """The store the command opened (:func:`open_store` says it), else the one its ``--store`` named, else the
    default."""
    from ..store import default_store_path

    if _OPENED.get() is not None:
        return str(_OPENED.get())
    args = ctx.meta.get(_COMMAND_ARGS, [])
    for i, arg in enumerate(args):
        if arg == "--store" and i + 1 < len(args):
            return str(args[i + 1])
        if arg.startswith("--store="):
            return arg.removeprefix("--store=")
    return str(default_store_path())


app = typer.Typer(
    cls=_OneLineErrors,
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,  # click's plain help: readable at 80 columns and in logs, choices listed, no type names
    pretty_exceptions_enable=False,
    help="Turn fine-tuned transformers into vectors from their weight deltas.\n\n" + EXIT_STATUSES,
)

StoreOpt = typer.Option(
    None, "--store", metavar="PATH", help="DuckDB store (default: $MODELVEC_STORE or ./modelvec.duckdb)."
)
WaitOpt = typer.Option(
    None,
    "--wait",
    min=0,
    metavar="SECONDS",
    help="While another process uses the store, wait this long for it (default: $MODELVEC_STORE_WAIT, else 600 for "
    "the commands that write it and 0 for those that only read it).",
)
JsonOpt = typer.Option(False, "--json", help="Print the API's answer as JSON instead of tables.")


def split_values(values: list[str] | None) -> list[str]:
    """Repeated and comma-separated values as one list: ``["a,b", "c"]`` -> ``["a", "b", "c"]``."""
    return [part.strip() for value in values or [] for part in value.split(",") if part.strip()]


def setting_values(cls: type, name: str, values: list[str] | None) -> list[Any]:
    """Repeated and comma-separated values of the setting ``name`` of ``cls``, each parsed and checked as its
    declaration says (``evaluate --rows auto,1,0.05``)."""
    field, meta = next((f, m) for f, m in settings_of(cls) if f.name == name)
    out = []
    for part in split_values(values):
        try:
            out.append(check_field(cls, name, parse_value(field, meta, part)))
        except ValueError as exc:
            raise typer.BadParameter(f"{part!r}: {exc}") from None
    return out


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


def open_store(path: Path | None, wait: float | None = None, *, read_only: bool = False) -> Store:
    """The store, opened now so that a wait for another process's run is said on one line before any progress bar.

    ``read_only`` (the commands that only read it): a missing store is refused rather than created, and while
    another process writes it the command says so at once unless told to wait (``--wait``,
    ``$MODELVEC_STORE_WAIT``)."""
    from ..store import Store

    if read_only and wait is None and constants.store_wait() is None:
        wait = 0.0
    store = Store(path, wait=wait, on_wait=lambda line: say(err, printable(line)), read_only=read_only)
    _OPENED.set(store.path)  # a later DuckDB error is said as this store's (_OneLineErrors)
    return store


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


def with_settings(
    cls: type,
    name: str,
    *,
    only: tuple[str, ...] | None = None,
    defaults: object | None = None,
    helps: dict[str, str] | None = None,
) -> Any:
    """Give a command one option per field of the settings class ``cls`` (their help, choices and bounds
    come from the declaration: :mod:`modelvec.core.settings`); the command receives them built and
    validated, as ``name=cls(...)``. Adding a field to ``cls`` adds its option to every such command.

    ``only``: the fields the command uses (the others keep their defaults); ``defaults``: an instance of ``cls``
    whose values are the command's defaults where the API's function has its own (``neighbors --k`` lists 10
    neighbours: :data:`~modelvec.analyse.scores.NEIGHBORS_SCORING`); ``helps``: where a command's meaning of a
    setting is narrower than the declaration's."""
    defaults, helps = defaults if defaults is not None else cls(), helps or {}

    def fields() -> list[tuple[Any, Any]]:
        return [(f, m) for f, m in settings_of(cls) if only is None or f.name in only]

    def build(values: dict[str, Any]) -> Any:
        try:
            for f, meta in fields():
                if (meta.words or meta.many) and values[f.name] is not None:
                    values[f.name] = parse_value(f, meta, ",".join(values[f.name]) if meta.many else values[f.name])
            return cls(**values)
        except ModelvecError:  # not a bad value: the machine (a device it lacks), said in one line
            raise
        except ValueError as exc:  # "thresholds must be ...": said as the option's ("Invalid value for '--threshold'")
            named = [flag_of(f, meta) for f, meta in fields() if str(exc).startswith(f"{f.name} ")]
            raise typer.BadParameter(str(exc), param_hint=f"'{named[0]}'" if named else None) from None

    options = {
        field.name: _option_of(field, meta, getattr(defaults, field.name), helps.get(field.name, meta.help))
        for field, meta in fields()
    }
    return options_as(name, options, build)


def options_as(name: str, options: dict[str, dict[str, Any]], build: Callable[[dict[str, Any]], Any]) -> Any:
    """A decorator that gives a command the typer ``options`` (field -> ``default``/``annotation``) in place of its
    parameter ``name``, and calls it with ``name=build({field: value given})``: how :func:`with_settings` and
    :func:`~modelvec.cli.sweeps.with_sweeps` make a command's options from declarations."""

    def decorate(func: Any) -> Any:
        signature = inspect.signature(func)
        added = [
            inspect.Parameter(f"{name}__{field}", inspect.Parameter.POSITIONAL_OR_KEYWORD, **option)
            for field, option in options.items()
        ]
        before = list(signature.parameters.values())
        at = [p.name for p in before].index(name)  # the options stand where the command declares them
        parameters = [*before[:at], *added, *before[at + 1 :]]

        @functools.wraps(func)
        def command(*args: Any, **kwargs: Any) -> Any:
            kwargs[name] = build({field: kwargs.pop(f"{name}__{field}") for field in options})
            return func(*args, **kwargs)

        command.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
        annotations = {k: v for k, v in func.__annotations__.items() if k != name}
        command.__annotations__ = {**annotations, **{p.name: p.annotation for p in added}}
        return command

    return decorate


def _option_of(field: Any, meta: Setting, default: Any, help: str) -> dict[str, Any]:
    """A declared setting as a typer option: the parameter's ``default`` (the option) and ``annotation``.

    A number that also takes words (``--rows auto``) and a setting of many values (``--threshold 0.5,0.9``,
    repeated or comma-separated) arrive as text, parsed as the declaration says; choices are a ``Literal``, which
    typer lists in the help."""
    flag, kind, choices = flag_of(field, meta), kind_of(field, meta), choices_of(meta)
    if meta.many:
        kind, default = list[str], [value_text(default)]
    elif meta.words:
        kind, default = str, default if isinstance(default, str) else value_text(default)
    decls = [f"{flag}/{meta.negation or '--no-' + flag[2:]}"] if kind is bool else [flag]
    metavar = meta.metavar or (None if choices or kind is bool else {int: "N", float: "X"}.get(kind, "VALUE"))
    option = typer.Option(
        default,
        *decls,
        help=help,
        metavar=metavar,
        min=None if meta.words or meta.many else meta.minimum,
        max=None if meta.words or meta.many else meta.maximum,
        show_default=default is not None,
    )
    annotation: Any = Literal[choices] if choices and not meta.many else kind  # typer lists a Literal's choices
    return {"default": option, "annotation": annotation if field.default is not None else annotation | None}
