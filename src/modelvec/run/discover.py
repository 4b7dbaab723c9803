"""Discovery with the reading stage's judgement: Hub candidates matched against the base's architecture, and the
catalogue written to the store page by page, so that a stopped discovery goes on where it stopped."""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

import pandas as pd

from ..core.settings import with_options
from ..hub.client import HubSettings
from ..hub.discovery import (
    CatalogueEntry,
    Discovery,
    Listing,
    Page,
    Progress,
    Resume,
    Scope,
    search_finetunes,
    stream_finetunes,
)
from ..hub.ids import resolve_base
from ..read.matching import ArchitectureMatcher
from ..store import Store, opened


def discover(
    base: str,
    scope: Scope | None = None,
    *,
    store: Store | str | os.PathLike[str] | None = None,
    hub_settings: HubSettings | None = None,
    progress: Progress | None = None,
    **options: Any,
) -> Discovery:
    """Find the fine-tunes of the Hub model ``base`` as far as ``scope`` says (:class:`~modelvec.hub.discovery.Scope`;
    its settings may also be given one by one: ``discover(base, limit=10)``); see
    :func:`modelvec.hub.discovery.search_finetunes`.

    Name-search candidates are kept when their config or safetensors header has the base's
    matrices, as the architecture tables say (:class:`~modelvec.read.matching.ArchitectureMatcher`).
    With ``store``, the catalogue is stored there page by page as it is found (stored vectors are kept; their labels
    refreshed), from where an earlier discovery of the same scope stopped (:func:`discover_pages`).
    """
    scope = with_options(Scope, scope, options, "discover")
    if store is None:
        return search_finetunes(
            base, scope, hub_settings=hub_settings, progress=progress, matcher=ArchitectureMatcher()
        )
    answered = None
    if not isinstance(store, Store) and not os.path.lexists(store):  # a new store: made once the Hub has answered, so
        pages = stream_finetunes(  # a discovery that cannot start (no network, no such base) leaves no empty store
            base, scope, hub_settings=hub_settings, progress=progress, matcher=ArchitectureMatcher()
        )
        answered = itertools.chain([next(pages)], pages)
    with opened(store) as db:
        if answered is None:
            *_, last = discover_pages(base, scope, db, hub_settings=hub_settings, progress=progress, refresh=True)
        else:
            *_, last = stored_pages(base, scope, db, None, pages=answered)
        return Discovery(last.base, last.base_sha, last.entries, last.notes)


def discovered(db: Store, base: str, scope: Scope) -> bool:
    """Whether the store holds a finished discovery of ``base``: a catalogue stored whole by an earlier version, or
    page by page to its end (of any scope, as a stored catalogue always was; a stopped one is not finished)."""
    canonical = resolve_base(base).canonical
    progress = db.reads.discovery(canonical)
    if progress.empty:
        return not db.reads.catalogue(canonical).empty
    return bool(progress.iloc[0]["done"])


def discover_pages(
    base: str,
    scope: Scope,
    db: Store,
    *,
    hub_settings: HubSettings | None = None,
    progress: Progress | None = None,
    refresh: bool = False,
) -> Iterator[Page]:
    """Discovery into ``db``, a page at a time: each listing page's new entries are stored (with how far each listing
    went) before the page is yielded and before the next one is asked for (the last page is ``done``: every entry), so a run killed at any point loses at most
    the page in flight, and the next call goes on from the stored cursor. ``refresh`` starts afresh (a finished
    discovery, or one of another scope, always does)."""
    resume = resumable(db, base, scope, refresh)
    yield from stored_pages(base, scope, db, resume, hub_settings=hub_settings, progress=progress)


def resumable(db: Store, base: str, scope: Scope, refresh: bool = False) -> Resume | None:
    """What a stopped discovery of ``base`` left in ``db`` for this ``scope``; None (its progress forgotten) when
    there is none to go on from, or with ``refresh``."""
    canonical = resolve_base(base).canonical
    resume = None if refresh else _resume(db, canonical, scope)
    if resume is None:
        db.writes.forget_discovery(canonical)
    return resume


def stored_pages(
    base: str,
    scope: Scope,
    db: Store,
    resume: Resume | None,
    *,
    hub_settings: HubSettings | None = None,
    progress: Progress | None = None,
    pages: Iterator[Page] | None = None,
) -> Iterator[Page]:
    """:func:`discover_pages` from ``resume`` (see :func:`resumable`); it touches the store only through
    :meth:`~modelvec.store.writes.Writes.put_discovery_page`, so it may run in a thread of its own. ``pages``: the Hub's
    pages, already asked for (from ``resume``)."""
    key = _scope_key(scope)
    if pages is None:
        matcher = ArchitectureMatcher()
        pages = stream_finetunes(
            base, scope, hub_settings=hub_settings, progress=progress, matcher=matcher, resume=resume
        )
    for page in pages:
        listings = [(x.key, json.dumps(x.query, sort_keys=True), x.cursor, x.done) for x in page.listings]
        db.writes.put_discovery_page(page.base, page.base_sha, page.entries, listings, scope=key, done=page.done)
        yield page


def _scope_key(scope: Scope) -> str:
    return json.dumps(asdict(scope), sort_keys=True)


def _resume(db: Store, canonical: str, scope: Scope) -> Resume | None:
    """What a stopped discovery of this scope left in the store; None: nothing to go on from."""
    progress = db.reads.discovery(canonical)
    if progress.empty or bool(progress.iloc[0]["done"]) or progress.iloc[0]["query"] != _scope_key(scope):
        return None
    listings = [
        Listing(r["listing"], json.loads(r["query"]), None if pd.isna(r["cursor"]) else r["cursor"], bool(r["done"]))
        for _, r in progress.iloc[1:].iterrows()
    ]
    return Resume(str(db.reads.base_sha(canonical) or ""), catalogue_entries(db, canonical, kept=None), listings)


def catalogue_entries(db: Store, base: str, kept: bool | None = True, model: str | None = None) -> list[CatalogueEntry]:
    """The stored catalogue of ``base`` (or one ``model`` of it) as entries, most downloaded first."""
    frame = db.reads.catalogue(base, kept=kept, model=model)
    entries = []
    for row in frame.to_dict("records"):
        row.pop("discovered_at", None)
        labels = json.loads(row.pop("labels_json") or "[]")
        for key in ("tags", "files", "formats", "datasets", "parents"):
            row[key] = list(row[key]) if row[key] is not None else []
        for key in ("downloads", "likes"):
            row[key] = None if pd.isna(row[key]) else int(row[key])
        row["depth"] = 1 if row["depth"] is None or pd.isna(row["depth"]) else int(row["depth"])
        entries.append(CatalogueEntry(**row, labels=labels))
    return entries
