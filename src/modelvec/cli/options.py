"""A command's options: those every command has (``--store``, ``--wait``, ``--json``), values given repeated or
comma-separated, and options made from a declared settings class (:mod:`modelvec.core.settings`)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, Literal

import typer

from ..core.errors import ModelvecError
from ..core.settings import Setting, check_field, choices_of, flag_of, kind_of, parse_value, settings_of, value_text

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
