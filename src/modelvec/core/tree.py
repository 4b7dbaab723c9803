"""The Hub's model tree as modelvec follows it: the relations a card declares to its parents, how deep discovery goes
below a base, and which fine-tunes it keeps (:class:`Scope`). Light: the commands that take a scope (``discover``,
``embed BASE``) declare their options from it without importing the Hub client, which :mod:`modelvec.hub.discovery`
(the discovery itself) imports."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

from .settings import setting, validate

#: The ``base_model:<relation>:<parent>`` tags of the Hub's model tree, each followed from the base down.
RELATIONS = ("finetune", "adapter", "merge", "quantized")
#: Levels of the model tree followed below the base unless asked otherwise.
DEPTH = 3
SORTS = ("downloads", "likes", "created_at", "last_modified")
#: The orders a stored catalogue is put in again (its own order is discovery's: declared fine-tunes first, most
#: downloaded first, then name-search matches; it keeps no modification dates).
RESORTED = ("likes", "created_at")
E = TypeVar("E", bound=Any)  # a catalogue entry (:class:`~modelvec.hub.discovery.CatalogueEntry`)


@dataclass(frozen=True)
class Scope:
    """Which fine-tunes discovery keeps, each setting declared once (``discover``'s options and ``embed BASE``'s are
    made from them): validated once, passed whole."""

    limit: int | None = setting(None, "Keep at most this many fine-tunes.", kind=int, minimum=1, metavar="N")
    sort: str = setting("downloads", "Listing order: which first.", choices=SORTS)
    search: bool = setting(True, "Also search by name and keep candidates whose config matches the base.")
    depth: int = setting(DEPTH, "Levels of the Hub's model tree followed below the base.", minimum=1, metavar="N")

    def __post_init__(self) -> None:
        validate(self)

    def ordered(self, entries: list[E]) -> list[E]:
        """A stored catalogue's kept entries in this order, at most ``limit``: by likes or creation, most first;
        else in discovery's order (:data:`RESORTED`)."""
        if self.sort in RESORTED:
            empty = 0 if self.sort == "likes" else ""
            entries = sorted(entries, key=lambda e: getattr(e, self.sort) or empty, reverse=True)
        return entries[: self.limit] if self.limit else entries
