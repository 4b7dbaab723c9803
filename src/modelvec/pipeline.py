"""The embedding pipeline: many fine-tunes of one base, through the store, failures recorded.

Models are local folders or files, Hub ids, or catalogue entries from discovery. A Hub model is
identified by its commit sha, so a stored vector is recognised before anything is downloaded; its
files are fetched pinned to that sha and, with ``keep_weights=False``, deleted once embedded. The
base is read once, lazily: a run where everything is stored never reads it. Each vector is written
to the store as soon as it is computed; a bad model is recorded as failed with its one-line reason
and the run goes on.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import pandas as pd

import json
import re

from .cards import card_author, card_datasets, read_card
from .checkpoint import Checkpoint
from .discovery import CatalogueEntry, describe, discover
from .download import FetchError, fetch, release, resolve_revision
from .errors import CheckpointError, ModelvecError
from .hub import HubSettings, describe_error, resolve_base, with_retries
from .representation import DeltaEmbedder, Representation
from .store import Store, VectorRow

PathLike = str | os.PathLike[str]


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")


def is_hub_id(model: object) -> bool:
    """A string that names a Hub repository (``org/name`` or a legacy ``name``) and no local path."""
    text = str(model)
    return not os.path.exists(text) and bool(_HUB_ID.fullmatch(text)) and ".." not in text


def model_id(model: PathLike | str) -> str:
    """How the store names a model: a local one by its absolute path, a Hub one by its repo id."""
    return str(model) if is_hub_id(model) else str(Path(model).resolve())


def display_name(model: PathLike | str) -> str:
    """A readable name for a model or base: a local folder named just "model" is named with its parent."""
    path = Path(model)
    return f"{path.parent.name}/{path.name}" if path.name in ("model", "base", "") and path.parent.name else path.name


@dataclass
class EmbedResult:
    """What ``embed`` did: the vectors of the requested models that are stored, and what failed."""

    vectors: np.ndarray
    metadata: pd.DataFrame
    embedded: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)


Progress = Callable[[str, str, str], None]  # (model, status, detail)


Model = PathLike | str | CatalogueEntry


@dataclass
class _Job:
    """One model to embed: a name, a cheap identity, and how to get its files and labels."""

    name: str
    source: str
    identity: Callable[[], str]
    open: Callable[[], Checkpoint]
    labels: Callable[[Checkpoint], tuple[list[str], str | None, str | None]]
    done: Callable[[], None] = lambda: None


def embed(
    base: PathLike | str,
    models: Iterable[Model],
    *,
    representation: Representation | None = None,
    device: str = "cpu",
    store: Store | PathLike | None = None,
    force: bool = False,
    progress: Progress | None = None,
    settings: HubSettings | None = None,
    keep_weights: bool = True,
    **params: Any,
) -> EmbedResult:
    """Embed fine-tunes of ``base`` into the store and return their vectors and metadata.

    ``base`` and each model are a local folder or weights file, or a Hub id (models may also be
    :class:`CatalogueEntry` from :func:`discover`). The representation is ``representation`` or
    built from keyword parameters (``rank=8, factor="sketch", pooling="mean", ...``; see
    :class:`Representation`). Models already stored with the same weights (content hash, or
    commit sha for Hub models), base and representation are skipped unless ``force``. A model
    that fails is recorded (``result.failed``: model -> reason) and the run goes on. Hub models
    are fetched through the huggingface_hub cache; ``keep_weights=False`` deletes each one's
    files once embedded (the base stays). ``store=None`` uses ``$MODELVEC_STORE`` or
    ``./modelvec.duckdb``.
    """
    params = representation or Representation(**params)
    settings = settings or HubSettings()
    own_store = not isinstance(store, Store)
    db = Store(store) if own_store else store
    try:
        return _run(base, list(models), params, device, db, force, progress or (lambda *_: None), settings,
                    keep_weights)
    finally:
        if own_store:
            db.close()


def embed_discovered(
    base: str,
    *,
    refresh: bool = False,
    limit: int | None = None,
    sort: str = "downloads",
    store: Store | PathLike | None = None,
    settings: HubSettings | None = None,
    **kwargs: Any,
) -> EmbedResult:
    """Embed every discovered fine-tune of the Hub model ``base`` (at most ``limit``, most downloaded first).

    The catalogue stored by an earlier discovery is used; with ``refresh`` or when there is none,
    :func:`discover` runs first and its catalogue is stored. Other keyword arguments go to
    :func:`embed`.
    """
    settings = settings or HubSettings()
    canonical = resolve_base(base).canonical
    own_store = not isinstance(store, Store)
    db = Store(store) if own_store else store
    try:
        if refresh or db.catalogue(canonical).empty:
            found = discover(base, limit=limit, sort=sort, settings=settings)  # type: ignore[arg-type]
            db.put_catalogue(found.base, found.base_sha, found.entries)
        entries = catalogue_entries(db, canonical, kept=True)
        if sort in ("likes", "created_at"):
            key = {"likes": lambda e: e.likes or 0, "created_at": lambda e: e.created_at or ""}[sort]
            entries.sort(key=key, reverse=True)
        return embed(canonical, entries[:limit] if limit else entries, store=db, settings=settings, **kwargs)
    finally:
        if own_store:
            db.close()


def catalogue_entries(db: Store, base: str, kept: bool | None = True, model: str | None = None) -> list[CatalogueEntry]:
    """The stored catalogue of ``base`` (or one ``model`` of it) as entries, most downloaded first."""
    frame = db.catalogue(base, kept=kept, model=model)
    entries = []
    for row in frame.to_dict("records"):
        row.pop("discovered_at", None)
        labels = json.loads(row.pop("labels_json") or "[]")
        for key in ("tags", "files", "formats", "datasets"):
            row[key] = list(row[key]) if row[key] is not None else []
        for key in ("downloads", "likes"):
            row[key] = None if pd.isna(row[key]) else int(row[key])
        entries.append(CatalogueEntry(**row, labels=labels))
    return entries


def _run(base: PathLike | str, models: Sequence[Model], params: Representation, device: str, db: Store,
         force: bool, progress: Progress, settings: HubSettings, keep_weights: bool) -> EmbedResult:
    base_name, base_hash, open_base = _base(base, db, settings)
    embedder: DeltaEmbedder | None = None
    result = EmbedResult(np.zeros((0, 0), np.float32), pd.DataFrame())
    wanted: list[str] = []
    for model in models:
        name = model.model if isinstance(model, CatalogueEntry) else model_id(model)
        wanted.append(name)
        start = time.perf_counter()
        job: _Job | None = None
        model_hash: str | None = None
        try:
            job = _job(model, base_name, db, settings, keep_weights)
            model_hash = job.identity()
            if not force and db.has(name, model_hash, base_name, base_hash, params):
                result.skipped.append(name)
                progress(name, "skipped", "already stored")
                continue
            known = None if force else db.known_failure(name, model_hash, base_name, params)
            if known is not None:  # the same weights failed before: not fetched or read again (--force retries)
                result.failed[name] = known
                progress(name, "failed", known)
                continue
            if embedder is None:
                embedder = DeltaEmbedder.from_params(params, device).fit(open_base())
            ck = job.open()
            vector = embedder.embed_one(ck)
            seconds = time.perf_counter() - start
            datasets, label_source, author = job.labels(ck)
            ck.close()
            db.put(VectorRow(name, model_hash, base_name, base_hash, params, embedder.layout_.arch.name, vector,
                             datasets, job.source, seconds, label_source=label_source, author=author))
            result.embedded.append(name)
            progress(name, "embedded", f"{seconds:.2f}s")
        except ModelvecError as exc:
            if exc.model == base_name:  # the base itself is broken: nothing can be embedded
                raise
            # A failure to fetch may pass (network, access); one of the content is kept with its hash.
            content = None if isinstance(exc, FetchError) else model_hash
            _fail(db, result, progress, name, base_name, params, str(exc), content)
        except Exception as exc:  # a run over many models goes on; the reason is kept
            _fail(db, result, progress, name, base_name, params, f"{name}: {type(exc).__name__}: {exc}".splitlines()[0],
                  model_hash)
        finally:
            if job is not None:
                job.done()
    result.vectors, result.metadata = db.load(base_name, params, models=wanted)
    return result


def _base(base: PathLike | str, db: Store, settings: HubSettings) -> tuple[str, str, Callable[[], Checkpoint]]:
    """The base's store name, identity, and a lazy opener (a Hub base is fetched only when needed)."""
    if not is_hub_id(base):
        ck = Checkpoint(base, name=model_id(base))
        return ck.name, ck.fingerprint(), lambda: ck
    canonical = resolve_base(str(base)).canonical
    sha = db.base_sha(canonical) or resolve_revision(canonical, "main", settings)
    opened: list[Checkpoint] = []

    def open_base() -> Checkpoint:
        if not opened:
            opened.append(Checkpoint(fetch(canonical, sha, None, settings), name=canonical))
        return opened[0]

    return canonical, f"git:{sha}", open_base


def _job(model: Model, base: str, db: Store, settings: HubSettings, keep_weights: bool) -> _Job:
    if isinstance(model, CatalogueEntry) or is_hub_id(model):
        entry = model if isinstance(model, CatalogueEntry) else _hub_entry(str(model), base, db, settings)
        if not entry.sha:
            raise CheckpointError(entry.model, "no revision recorded for this model; run discovery again")
        sha = entry.sha

        def done() -> None:
            if not keep_weights:
                release(entry.model, sha, settings)

        return _Job(
            name=entry.model, source=f"hf://{entry.model}@{sha}", identity=lambda: f"git:{sha}",
            open=lambda: Checkpoint(fetch(entry.model, sha, entry.files or None, settings), name=entry.model),
            labels=lambda ck: (list(entry.datasets), entry.label_source, entry.author), done=done,
        )
    name = model_id(model)
    holder: list[Checkpoint] = []

    def opened() -> Checkpoint:
        if not holder:
            holder.append(Checkpoint(model, name=name))
        return holder[0]

    def labels(ck: Checkpoint) -> tuple[list[str], str | None, str | None]:
        card = read_card(ck.folder)
        datasets = card_datasets(card)
        return datasets, "card" if datasets else None, card_author(card)

    return _Job(name=name, source=str(Path(model)), identity=lambda: opened().fingerprint(), open=opened,
                labels=labels)


def local_files(name: str, source: str, db: Store, settings: HubSettings | None = None) -> str:
    """A stored model's files on this machine: its path, or a Hub model fetched at its stored revision."""
    settings = settings or HubSettings()
    if source.startswith("hf://") and "@" in source:
        repo, sha = source[len("hf://"):].rsplit("@", 1)
        return str(fetch(repo, sha, None, settings))
    if is_hub_id(name):  # a Hub base
        canonical = resolve_base(name).canonical
        sha = db.base_sha(canonical) or resolve_revision(canonical, "main", settings)
        return str(fetch(canonical, sha, None, settings))
    return name


def _hub_entry(repo_id: str, base: str, db: Store, settings: HubSettings) -> CatalogueEntry:
    """A Hub model named directly: its catalogue entry, or (online) what the Hub says about it now."""
    stored = catalogue_entries(db, base, kept=None, model=repo_id)
    if stored and (settings.offline or stored[0].sha):
        return stored[0]
    try:
        info = with_retries(lambda: settings.api().model_info(repo_id), settings, repo_id)
    except Exception as exc:
        where = "no such local path, and on the Hub: " if "/" in repo_id or "." in repo_id else ""
        raise CheckpointError(repo_id, where + describe_error(exc)) from exc
    return describe(info, base, True, "named by the user")


def _fail(db: Store, result: EmbedResult, progress: Progress, name: str, base: str, params: Representation, error: str,
          model_hash: str | None = None) -> None:
    db.record_failure(name, base, params, error, model_hash)
    result.failed[name] = error
    progress(name, "failed", error)
