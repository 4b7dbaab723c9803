"""What a base's stored models are beside each other, from what the store holds: which are copies of which
(identical weights, re-saves in another dtype: :mod:`modelvec.analyse.tree.copies`), what each card declares, and when
each model was made. The one rule every report reads, through :class:`~modelvec.store.Population`."""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd

from ...analyse.tree.copies import Copy, Traced, find_copies
from ...analyse.tree.rule import TreeRule
from ...core.errors import ModelvecError
from ...core.files import oldest_time
from ..formats.vectorfile import zero_checksum
from ..store import Store

#: What a card declares: its relation to its parents (None: not said) and the parents it names.
Declared = tuple[str | None, list[str]]


def declared(db: Store, base: str, meta: pd.DataFrame, root: Sequence[str]) -> dict[str, Declared]:
    """What each model's card declares, its parents named as the store names them (``base`` for any of the base's
    names ``root``; a local folder's bare name for the stored folder of that name): read with the model by embed,
    else from the Hub catalogue, else (stored before cards were kept) from the card on this machine now."""
    models = list(dict.fromkeys(meta["model"]))
    by_folder = {Path(m).name: m for m in models if not _is_hub(m)}
    lower = {r.lower() for r in root}
    catalogue = db.reads.catalogue(base=base)
    hub = {r.model: r for r in catalogue.itertuples()} if not catalogue.empty else {}
    rows = meta.drop_duplicates("model").set_index("model")
    out: dict[str, Declared] = {}
    for m in models:
        row = rows.loc[m]
        relation, parents = _stored(row)
        if relation is None and not parents and m in hub and hub[m].relation is not None:
            relation, parents = hub[m].relation, list(hub[m].parents if hub[m].parents is not None else [])
        elif relation is None and not parents and _maybe(row, "card_hash") is None:
            relation, parents = _from_card(str(_maybe(row, "source") or m))
        if relation is None and not parents:
            continue
        out[m] = (relation, [base if p.lower() in lower else by_folder.get(p, p) for p in parents])
    return out


def created(db: Store, base: str, meta: pd.DataFrame, models: Sequence[str]) -> dict[str, str]:
    """When each of ``models`` was made, as comparable text: a local model's weight files' oldest modification time,
    then their oldest change time (``cp -p`` keeps the first, not the second: the copy is the later), read now; else
    as embed kept it, else the Hub catalogue's date (ISO, UTC); a model with none is left out."""
    rows = meta.drop_duplicates("model").set_index("model")
    catalogue = db.reads.catalogue(base=base)
    hub = dict(zip(catalogue["model"], catalogue["created_at"])) if not catalogue.empty else {}
    out = {}
    for m in models:
        local = files_time(str(_maybe(rows.loc[m], "source") or m))
        when = _maybe(rows.loc[m], "created") or hub.get(m)
        if local is not None:
            out[m] = local
        elif isinstance(when, str) and when:
            out[m] = f"{_utc(when)}|"
    return out


def files_time(path: str) -> str | None:
    """A local model's weight files' oldest modification time (ISO, UTC) and oldest change time (ns), as comparable
    text; None for a Hub model, a path gone, or one that cannot be opened now."""
    from ...read import open_checkpoint

    if _is_hub(path) or not os.path.exists(path):
        return None
    try:
        files = open_checkpoint(path).files
        changed = min(f.stat().st_ctime_ns for f in files)
    except (OSError, ModelvecError):
        return None
    made = oldest_time(files)
    return f"{made}|{changed:020d}" if made else None


def copies(
    db: Store, name: str, params: str, base_hash: str, meta: pd.DataFrame, hashes: Sequence[str], root: Sequence[str]
) -> dict[str, Copy]:
    """The copies among a population's models (``meta`` and their vectors' checksums ``hashes``, in order), each
    with its original: identical traces (or vectors, where no trace is kept), zero ones (the base's weights), and
    re-saves within their dtype's rounding of a finer model or of the base."""
    if meta.empty:
        return {}
    stored = db.reads.traces(name, params, base_hash, read=False).frame
    models = list(meta["model"])
    rows = stored.drop_duplicates("model").set_index("model").reindex(models)  # a model without a trace: NaN
    zero_of = {d: zero_checksum(d) for d in set(meta["dim"])}
    norm, rounding = _numbers(rows["norm"]), _numbers(rows["rounding"])
    missing = [m for m, v, r in zip(models, norm, rounding) if v is None and r is not None]
    if missing:  # traces kept before their norm was: read once
        found = _norms(db, name, params, base_hash, missing)
        norm = [found.get(m, v) for m, v in zip(models, norm)]
    traced = Traced(
        models=models,
        digest=[d if isinstance(d, str) else f"vector:{h}" for d, h in zip(rows["sketch_hash"], hashes)],
        zero=[h == zero_of[d] or v == 0.0 for h, d, v in zip(hashes, meta["dim"], norm)],
        norm=norm,
        precision=[p if isinstance(p, str) else None for p in rows["precision"]],
        rounding=rounding,
        same=_numbers(rows["zeros"]),
        mini=[np.asarray(v, np.float64) if isinstance(v, (list, np.ndarray)) else None for v in rows["mini"]],
        resaved=[not bool(a is True) and not isinstance(q, str) for a, q in zip(meta["adapter"], meta["quantized"])],
        scale=float(stored["scale"].iloc[0]) if len(stored) else 0.0,
    )

    def about(group: list[str]) -> tuple[dict[str, list[str]], dict[str, str]]:
        cards = declared(db, name, meta[meta["model"].isin(group)], root)
        return {m: parents for m, (_, parents) in cards.items()}, created(db, name, meta, group)

    def distance(pairs: list[tuple[int, int]]) -> np.ndarray:
        return _distances(db, name, params, base_hash, models, pairs)

    return find_copies(traced, distance, base=name, rule=TreeRule(), about=about)


def _distances(
    db: Store, name: str, params: str, base_hash: str, models: list[str], pairs: list[tuple[int, int]]
) -> np.ndarray:
    """The distances between the traces of ``pairs`` (positions in ``models``), each sketch read once and verified
    (a damaged one is at infinite distance: it copies nothing)."""
    wanted = sorted({models[k] for pair in pairs for k in pair})
    stored = db.reads.traces(name, params, base_hash, models=wanted)
    at = {m: i for i, m in enumerate(stored.frame["model"])}
    out = np.full(len(pairs), np.inf)
    for p, (i, j) in enumerate(pairs):
        a, b = at.get(models[i]), at.get(models[j])
        if a is not None and b is not None:
            out[p] = float(np.linalg.norm(stored.sketches[a].astype(np.float64) - stored.sketches[b]))
    return out


def _norms(db: Store, name: str, params: str, base_hash: str, models: list[str]) -> dict[str, float]:
    stored = db.reads.traces(name, params, base_hash, models=models)
    return {m: float(np.linalg.norm(s.astype(np.float64))) for m, s in zip(stored.frame["model"], stored.sketches)}


def _stored(row: pd.Series) -> Declared:
    """What a model's card declared when embed read it (its row's ``relation`` and ``parents``)."""
    relation, parents = _maybe(row, "relation"), _maybe(row, "parents")
    listed = [str(p) for p in parents] if isinstance(parents, (list, tuple, np.ndarray)) else []
    return (str(relation) if isinstance(relation, str) else None), listed


def _from_card(source: str) -> Declared:
    """What a local model's card on this machine declares now (a weights file's: the card of its folder)."""
    folder = source if os.path.isdir(source) else str(Path(source).parent) if os.path.isfile(source) else ""
    if not folder:
        return None, []
    from ...hub.cards import model_card  # the Hub's client only where a local card is read

    card = model_card(folder, source)
    return card.relation, card.parents


def _maybe(row: pd.Series, column: str) -> object:
    value = row.get(column)
    if value is None or (not isinstance(value, (list, tuple, np.ndarray)) and pd.isna(value)):
        return None
    return value


def _numbers(column: pd.Series) -> list[float | None]:
    """A column's numbers, None for a missing one."""
    return [None if pd.isna(v) else float(v) for v in column]


def _utc(when: str) -> str:
    """An ISO date as comparable text in UTC (the Hub's ``2024-01-02T03:04:05.000Z``, a local time with its zone)."""
    try:
        stamp = datetime.fromisoformat(when.replace("Z", "+00:00"))
    except ValueError:
        return when
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=UTC)
    return stamp.astimezone(UTC).isoformat(timespec="seconds")


def _is_hub(name: str) -> bool:
    from ...core.names import is_hub_id

    return is_hub_id(name)
