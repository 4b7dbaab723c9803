"""Models as tasks: what a run computes, and the base it computes them against.

A Hub model is identified by its commit sha, a local one by its files' stamp, so a stored vector is recognised
before anything is downloaded; an adapter carries the model it is embedded on (the one its ``adapter_config.json``
names) where that is not the base. The base's spec records its version, computed once per version of its files.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from ..core.errors import CheckpointError, FetchError, ModelvecError, error_of
from ..core.files import ADAPTER_CONFIG, oldest_time
from ..core.names import is_hub_id, model_id
from ..hub.client import HubSettings, describe_error, with_retries
from ..hub.discovery import CatalogueEntry, describe
from ..hub.download import download_file, fetch, resolve_revision, weights_identity
from ..hub.ids import resolve_base
from ..read import Checkpoint, adapter_parent, open_checkpoint, refuse_adapter_base
from ..store import Store
from .discover import catalogue_entries
from .work import BaseSpec, Task, files_id

PathLike = str | os.PathLike[str]
Model = PathLike | str | CatalogueEntry


def base_spec(base: PathLike | str, db: Store, hub_settings: HubSettings) -> BaseSpec:
    """The base's store name and version (``base_hash``), recorded with its files' stamp so that a report knows
    the version without hashing the base, and how to open it (a Hub base is fetched only when needed).

    A local base's version is its content's hash, computed once per version of its files: a run whose base files'
    stamp (names, sizes, times, headers) was recorded takes the version recorded with it, as a model's files are
    recognised by theirs."""
    if not is_hub_id(base):
        refuse_adapter_base(base, model_id(base))
        ck = Checkpoint(base, name=model_id(base))
        stamp = ck.stamp()
        version = db.versions.recorded_base(ck.name, stamp) or ck.fingerprint()
        db.versions.record_base(ck.name, stamp, version)
        return BaseSpec(ck.name, version, path=str(ck.path))
    canonical = resolve_base(str(base)).canonical
    sha = db.reads.base_sha(canonical) or resolve_revision(canonical, "main", hub_settings)
    stamp = f"git:{sha}"
    version = db.versions.recorded_base(canonical, stamp) or _same_weights(canonical, sha, db, hub_settings) or stamp
    db.versions.record_base(canonical, stamp, version)
    return BaseSpec(canonical, version, repo=canonical, sha=sha)


def _same_weights(canonical: str, sha: str, db: Store, hub_settings: HubSettings) -> str | None:
    """The version recorded last for the Hub base ``canonical`` where its commit ``sha`` holds the same weights as
    the commit that version was recorded at (a commit that changed only the card does not make 10,000 vectors
    stale), asked of the Hub's file listings (two requests, once per new commit of the base); else None."""
    last = db.versions.recorded_base(canonical)
    if last is None or hub_settings.offline:
        return None
    before = [s.removeprefix("git:") for s in db.versions.stamps(canonical, last) if s.startswith("git:")]
    if not before or before[-1] == sha:
        return None
    now = weights_identity(canonical, sha, hub_settings)
    return last if now is not None and weights_identity(canonical, before[-1], hub_settings) == now else None


def task_of(model: Model, base: BaseSpec, db: Store, hub_settings: HubSettings) -> Task:
    """A model as a task: a Hub model is identified by its commit sha, a local one by its files' stamp; an adapter
    carries the model it is embedded on where that is not the base (:func:`_adapter_on`)."""
    if isinstance(model, CatalogueEntry) or is_hub_id(model):
        entry = model if isinstance(model, CatalogueEntry) else _hub_entry(str(model), base.name, db, hub_settings)
        if not entry.sha:
            raise CheckpointError(entry.model, "no revision recorded for this model; run discovery again")
        task = Task(
            name=entry.model,
            version=f"git:{entry.sha}",
            source=f"hf://{entry.model}@{entry.sha}",
            repo=entry.model,
            sha=entry.sha,
            files=tuple(entry.files or ()),
            datasets=tuple(entry.datasets),
            label_source=entry.label_source,
            author=entry.author,
            relation=entry.relation,
            parents=tuple(entry.parents or ()),
            created=entry.created_at,
        )
        if ADAPTER_CONFIG not in (entry.files or ()) and entry.relation != "adapter":
            return task
        named = _named_in_config(entry, hub_settings)
        return replace(task, parent=_adapter_on(task.name, named, base, db, hub_settings, entry.parents, hub=True))
    name = model_id(model)
    ck = open_checkpoint(model, name=name)
    task = Task(
        name=name,
        version=ck.stamp(),
        source=str(Path(model)),
        path=str(model),
        created=oldest_time(ck.files),
        files_id=files_id(ck),
    )
    if not ck.factored:
        return task
    return replace(task, parent=_adapter_on(name, adapter_parent(ck.path), base, db, hub_settings))


def _named_in_config(entry: CatalogueEntry, hub_settings: HubSettings) -> str | None:
    """The model a Hub adapter's ``adapter_config.json`` says it adapts (the file is fetched at the adapter's commit,
    into the cache its weights come to)."""
    path = download_file(entry.model, ADAPTER_CONFIG, str(entry.sha), hub_settings)
    return adapter_parent(Path(path).parent)


def _adapter_on(
    adapter: str,
    named: str | None,
    base: BaseSpec,
    db: Store,
    hub_settings: HubSettings,
    declared: Sequence[str] = (),
    *,
    hub: bool = False,
) -> Task | None:
    """The model an adapter is embedded on: the one its ``adapter_config.json`` names (``base_model_name_or_path``),
    whichever way the adapter was listed. None: the base (it names the base, or nothing and its card names no other
    stored model); a full model on this machine; a Hub model, fetched as its parent. A Hub adapter (``hub``) whose
    config names a folder names one on the machine it was trained on: the fine-tune its card names stands for it
    (``declared``). An adapter that names a model that cannot be found, or is not the base, is refused in one line:
    never embedded on another model."""
    if named is None:
        return _declared_parent(declared, base, db, hub_settings)
    if _names_base(named, base, hub=hub):
        return None
    if hub and not is_hub_id(named):  # a folder where it was trained: its card says which model that was
        parent = _declared_parent(declared, base, db, hub_settings)
        if parent is not None:
            return parent
    elif Path(named).is_dir():
        folder = open_checkpoint(named, name=model_id(named))
        if folder.factored:
            raise CheckpointError(adapter, f"its {ADAPTER_CONFIG} names {named}, an adapter too: give the merged model")
        return Task(name=folder.name, version=folder.stamp(), source=str(Path(named)), path=str(named))
    parent = _hub_parent(adapter, named, base, db, hub_settings) if is_hub_id(named) else None
    if parent is not None:  # a Hub model, whatever form the base takes: fetched as the adapter's parent
        if parent.parent is not None or ADAPTER_CONFIG in parent.files:
            raise CheckpointError(adapter, f"its {ADAPTER_CONFIG} names {named}, an adapter too: give the merged model")
        return parent
    where = "on this machine, in the store" + (" (the Hub is offline)" if hub_settings.offline else " or on the Hub")
    raise CheckpointError(
        adapter,
        f"its {ADAPTER_CONFIG} names {named} as the model it adapts, which is not the base ({base.name}) nor a model "
        f"found {where}: embed it with that model as the base, or write the base's folder or id in "
        "base_model_name_or_path",
    )


def _hub_parent(adapter: str, named: str, base: BaseSpec, db: Store, hub_settings: HubSettings) -> Task | None:
    """The Hub model an adapter's config names, as the run can have it: its catalogue entry, else its stored vector's
    commit (embedded earlier, or in this run), else what the Hub says of it now; None where the Hub is offline and
    nothing else has it. A fault of the parent (gone from the Hub, gated) is the adapter's, of its kind."""
    catalogued = catalogue_entries(db, base.name, kept=None, model=named)
    stored = [s for s in db.reads.metadata(base=base.name, models=[named])["source"] if s.startswith(f"hf://{named}@")]
    if not catalogued and not stored and hub_settings.offline:
        return None
    try:
        if catalogued:
            entry = catalogued[0]
        elif stored:
            entry = CatalogueEntry(
                named, base.name, True, "an adapter's parent, stored", sha=stored[-1].rsplit("@", 1)[1]
            )
        else:
            entry = _hub_entry(named, base.name, db, hub_settings)
        return task_of(entry, base, db, hub_settings)
    except Exception as exc:  # the parent's fault, said as the adapter's, of its kind
        err = error_of(exc, named)
        raise ModelvecError(adapter, f"its parent {named}: {err.cause}", kind=err.kind) from exc


def _names_base(named: str, base: BaseSpec, *, hub: bool = False) -> bool:
    """Whether an adapter's ``base_model_name_or_path`` names the base: its id or an alias of it, its folder, the
    Hub repository whose cached snapshot the base's folder is, or a folder elsewhere (the trainer's machine: a Hub
    adapter's folder is always there) of the base's name."""
    text = named.strip().rstrip("/")
    if base.repo is not None:
        names = {n.lower() for n in resolve_base(base.name).names} | {base.name.lower()}
        if text.lower() in names:
            return True
        short = {n.rsplit("/", 1)[-1] for n in names}
        elsewhere = hub or not os.path.exists(text)
        return not is_hub_id(text) and elsewhere and Path(text).name.lower() in short
    folder = Path(str(base.path)).resolve()
    if os.path.exists(text) and not hub:
        return Path(text).resolve() == folder
    if is_hub_id(text):
        return f"models--{text.replace('/', '--')}".lower() in (part.lower() for part in folder.parts)
    return Path(text).name == folder.name


def _declared_parent(declared: Sequence[str], base: BaseSpec, db: Store, hub_settings: HubSettings) -> Task | None:
    """The fine-tune a Hub adapter's card names (``base_model:adapter:<parent>``), where it is one of the tree's
    models and not the base: for an adapter whose config names nothing."""
    root = {n.lower() for n in resolve_base(base.name).names} | {base.name.lower()}
    for name in declared:
        if name.lower() not in root:
            found = catalogue_entries(db, base.name, kept=True, model=name)
            if found:
                return task_of(found[0], base, db, hub_settings)
    return None


def local_files(name: str, source: str, db: Store, hub_settings: HubSettings | None = None) -> str:
    """A stored model's files on this machine: its path, or a Hub model fetched at its stored revision."""
    hub_settings = hub_settings or HubSettings()
    if source.startswith("hf://") and "@" in source:
        repo, sha = source[len("hf://") :].rsplit("@", 1)
        return str(fetch(repo, sha, None, hub_settings))
    if is_hub_id(name):  # a Hub base
        canonical = resolve_base(name).canonical
        sha = db.reads.base_sha(canonical) or resolve_revision(canonical, "main", hub_settings)
        return str(fetch(canonical, sha, None, hub_settings))
    return name


def _hub_entry(repo_id: str, base: str, db: Store, hub_settings: HubSettings) -> CatalogueEntry:
    """A Hub model named directly: its catalogue entry, or (online) what the Hub says about it now."""
    stored = catalogue_entries(db, base, kept=None, model=repo_id)
    if stored and (hub_settings.offline or stored[0].sha):
        return stored[0]
    try:
        info = with_retries(lambda: hub_settings.api().model_info(repo_id), hub_settings, repo_id)
    except Exception as exc:  # a name given as is: a mistyped local folder reads as a Hub id, so say both
        raise FetchError(
            repo_id, f"no local file or folder of that name, and on the Hub: {describe_error(exc)}"
        ) from exc
    entry = describe(info, base, True, "named by the user")
    declared = [t.split(":")[1] for t in entry.tags if t.startswith("base_model:") and t.count(":") == 2]
    entry.relation = declared[0] if declared else None  # what its card declares, as the Hub's tags say it
    entry.parents = [t.split(":", 1)[1] for t in entry.tags if t.startswith("base_model:") and t.count(":") == 1]
    return entry
