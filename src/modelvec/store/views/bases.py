"""Which base a store's vectors are of: the names a base may be stored under, the stored base a query names, and the
representation a study reads a base's models under."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from ...core.errors import NothingStoredError
from ...core.names import model_id
from ...represent.representation import Representation
from ..store import Store, options_of


def base_names(base: str | os.PathLike[str]) -> list[str]:
    """The names a base given as ``base`` may be stored under: a local path's absolute path (and as typed), a Hub
    id as typed and its canonical id."""
    from ...hub.ids import resolve_base

    if os.path.exists(str(base)):
        return list(dict.fromkeys([model_id(base), str(base)]))
    return list(dict.fromkeys([str(base), resolve_base(str(base)).canonical]))


def find_base(
    db: Store,
    base: str | os.PathLike[str] | None,
    representation: Representation,
    names: Sequence[str] | None,
    stored: Sequence[str],
) -> str:
    """The stored name of ``base`` (None: the only base with vectors under ``representation``); one line saying what
    is stored instead where there is nothing. ``names``: ``base``'s names (:func:`base_names`; None for no base),
    ``stored``: those of them (every base, for no base) with vectors under ``representation``, as the caller read
    them (the store is asked again only to say what it holds instead)."""
    if base is not None:
        for name in names or []:
            if name in stored:
                return name
        raise NothingStoredError(
            str(base), f"no vectors stored for this base with representation {representation.key()}{_stored(db)}"
        )
    bases = sorted(set(stored))
    if not bases:
        raise NothingStoredError(
            str(db.path),
            f"no vectors stored with representation {representation.key()}"
            + (_stored(db) or "; run `modelvec embed` first"),
        )
    if len(bases) > 1:
        raise NothingStoredError(
            str(db.path),
            f"holds vectors of {len(bases)} bases with representation {representation.key()} "
            f"({', '.join(bases)}): name one with --base",
        )
    return bases[0]


def query_name(model: str | os.PathLike[str]) -> str:
    """A model asked about, as the store would name it: a path's absolute path, else the name as given."""
    return model_id(model) if os.path.exists(str(model)) else str(model)


def names_of(model: str | os.PathLike[str]) -> list[str]:
    """The names ``model`` has as a base (its absolute path; a Hub id's short and canonical ids); none where it
    cannot be a base's name."""
    try:
        return base_names(model)
    except ValueError:  # no base id (an empty name)
        return []


def stored_base(db: Store, model: str | os.PathLike[str], representation: Representation) -> str | None:
    """``model``'s stored name where it is a base with vectors under ``representation`` (None: it is none)."""
    return next(
        (n for n in names_of(model) if not db.reads.metadata(base=n, representation=representation).empty), None
    )


def stored_representation(db: Store, base: str | os.PathLike[str]) -> Representation:
    """The representation a study over a base's stored models reads them under, whatever it is: today's default
    where the base has vectors under it, else the one holding most of its vectors."""
    default = Representation()
    for name in base_names(base):
        summary = db.reads.summary()
        mine = summary[summary["base"] == name]
        if mine.empty:
            continue
        if (mine["params"] == default.key()).any():
            return default
        best = mine.sort_values(["models", "params"], ascending=[False, True]).iloc[0]
        try:
            return Representation.from_stored(json.loads(best["params_json"]))
        except (TypeError, ValueError):
            break
    return default


def _stored(db: Store) -> str:
    """What the store holds instead, with the options that read it (empty: nothing)."""
    stored = db.reads.summary()
    known = "; ".join(
        f"{b} [{p}: {options_of(s)}]" for b, p, s in zip(stored["base"], stored["params"], stored["params_json"])
    )
    return f" (stored, with the options that read them: {known}; or embed again)" if known else " (nothing stored)"
