"""Options that sweep fields of a settings class: each made from its field's declaration, taking several values.

``evaluate --rank 8,16,32 --rows auto,1``: the flag, help, allowed values, parsing and default of each option are
the field's (:mod:`modelvec.core.settings`), as ``embed --rank`` has them, so a sweep's one value by default is the
field's one default. The API takes the same values as :class:`modelvec.studies.sweep.Sweep`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import typer

from ..core.settings import bounds_text, flag_of, kind_of, settings_of, value_text
from .options import options_as, setting_values


def with_sweeps(
    cls: type,
    name: str,
    *,
    only: tuple[str, ...],
    aliases: Mapping[str, tuple[str, ...]] | None = None,
    notes: Mapping[str, str] | None = None,
) -> Any:
    """Give a command one option per field ``only`` of the settings class ``cls`` that takes several values,
    repeated or comma-separated (``--rank 8,16,32``), each parsed and checked as the field's declaration says. The
    command receives them as ``name=`` a dict, field -> the tuple of its values (where an option is not given,
    the field's default alone). Adding a field to ``only`` adds its option.

    ``aliases``: a field's other flags (``{"rank": ("--ranks",)}``); ``notes``: what several values do, where it
    is not that each is compared (``{"seed": "the scores are their mean and spread"}``)."""
    aliases, notes = aliases or {}, notes or {}
    declared = {f.name: (f, m) for f, m in settings_of(cls)}
    unknown = [field for field in only if field not in declared]
    if unknown:
        raise ValueError(f"{cls.__name__} declares no setting {', '.join(unknown)}")
    fields = [declared[field] for field in only]

    options = {}
    for field, meta in fields:
        metavar = meta.metavar or {int: "N", float: "X"}.get(kind_of(field, meta), "NAME")
        note = notes.get(field.name, "each is compared")
        option = typer.Option(
            [value_text(field.default)],
            flag_of(field, meta),
            *aliases.get(field.name, ()),
            metavar=f"{metavar},...",
            help=f"{meta.help} Repeated or comma-separated (each {bounds_text(meta)}): {note}.",
        )
        options[field.name] = {"default": option, "annotation": list[str]}

    def build(values: dict[str, list[str]]) -> dict[str, tuple[Any, ...]]:
        return {f.name: tuple(setting_values(cls, f.name, values[f.name])) or (f.default,) for f, _ in fields}

    return options_as(name, options, build)
