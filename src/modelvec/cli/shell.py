"""The command line's shell: its app, its one-line errors and exit statuses, the command class every command uses, and the
store a command opens (so that an error of the store's file names it).

Each command is a module of this package, a thin shell over one API call; what they share is here, in
:mod:`.printing` (how they print) and in :mod:`.options` (the options they have).
"""

from __future__ import annotations

import os
import re
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from typer.core import TyperGroup

from ..core import constants
from ..core.errors import ModelvecError
from .printing import err, printable, say

if TYPE_CHECKING:
    from ..store import Store


def left_out(damaged: dict[str, str]) -> None:
    """Each stored vector left out because its bytes do not match their checksum, one line each on stderr, and
    exit status 1 (the others were analysed)."""
    for line in damaged.values():
        say(err, f"left out: {printable(line)}")
    if damaged:
        raise typer.Exit(EXIT_SOME_FAILED)


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
                from ..store.formats.lock import store_error

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


@app.callback()
def _group() -> None:
    # A group even where the console script registered only the command it runs (modelvec.cli.main).
    pass


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
