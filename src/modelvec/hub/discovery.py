"""Finding the fine-tunes of a base model on the Hub, with why each was kept and what it was tuned on.

Two routes, as the description's collections were built:

1. **Declared**: models tagged ``base_model:finetune:<base>`` (the Hub derives the tag from the
   card's ``base_model:``), under the canonical id and the legacy short one; and PEFT LoRA
   adapters, tagged ``base_model:adapter:<base>``, kept when they hold ``adapter_config.json`` and
   adapter weights (format ``adapter``: :mod:`modelvec.read.adapters` embeds them like fine-tunes).
2. **Name search**: most fine-tunes from 2020-22 declare no base, so ``search=<short name>``
   candidates are kept only when their ``config.json`` matches the base (same model type, layer
   count, hidden and feed-forward sizes, heads: :attr:`Architecture.shape_keys`; vocabulary and
   head may differ). A candidate without config.json is checked from its safetensors header
   (two small range requests), never by downloading weights.

Every candidate becomes a :class:`CatalogueEntry` with the reason it was kept or rejected, its
pinned revision sha, author, counts, tags, weight formats and dataset labels with their source.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from ..core.errors import ModelvecError
from ..core.files import adapter_files, formats, weight_format
from ..core.tree import RELATIONS, Scope
from .client import HubSettings, describe_error, with_retries
from .download import download_file
from .guard import guard_hub_client
from .ids import BaseId, resolve_base
from .labels import dataset_labels, guess_from_name

#: What one listing call asks for, so no per-model call is needed: the card, the files, the revision, the parents
#: (``baseModels``), how many models name this one as their base (``childrenModelCount``: a model without children
#: costs no listing of its own), and ``config`` (``model_type`` and ``architectures``: a name-search candidate of
#: another family is rejected without fetching its config.json); ``safetensors`` (parameter counts) and ``gguf``
#: are asked for as the catalogue's (the reader still needs a file's own header for its shapes).
EXPAND = [
    "author",
    "baseModels",
    "cardData",
    "childrenModelCount",
    "config",
    "createdAt",
    "downloads",
    "gated",
    "gguf",
    "lastModified",
    "library_name",
    "likes",
    "model-index",
    "pipeline_tag",
    "private",
    "safetensors",
    "sha",
    "siblings",
    "tags",
]


@dataclass
class CatalogueEntry:
    """One model found for a base: kept (to embed) or rejected, and why."""

    model: str
    base: str
    kept: bool
    reason: str
    sha: str | None = None
    author: str | None = None
    created_at: str | None = None
    downloads: int | None = None
    likes: int | None = None
    pipeline_tag: str | None = None
    library: str | None = None
    gated: str | None = None
    tags: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    formats: list[str] = field(default_factory=list)
    datasets: list[str] = field(default_factory=list)
    label_source: str | None = None
    labels: list[dict[str, str]] = field(default_factory=list)  # provenance: dataset, source, raw
    #: the model tree as its card declares it: the relation to its parents (finetune, adapter, merge, quantized;
    #: None: found by name), every ``base_model`` it names, and its level below the base (1: a child of the base)
    relation: str | None = None
    parents: list[str] = field(default_factory=list)
    depth: int = 1

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Discovery:
    """The result of :func:`search_finetunes`: the base's revision and every candidate considered."""

    base: str
    base_sha: str
    entries: list[CatalogueEntry]
    #: what the walk of the model tree met and said once: a cycle of declared bases, where it stopped
    notes: list[str] = field(default_factory=list)

    @property
    def kept(self) -> list[CatalogueEntry]:
        return [e for e in self.entries if e.kept]

    @property
    def rejected(self) -> list[CatalogueEntry]:
        return [e for e in self.entries if not e.kept]

    @staticmethod
    def in_tree_order(entries: list[CatalogueEntry]) -> list[CatalogueEntry]:
        """``entries`` depth first, each model under the parent it was found under (the parent one level up), so an
        indented list reads as the tree; models found by name come last, as found."""
        level = {e.model.lower(): e.depth for e in entries if e.relation}
        children: dict[str | None, list[CatalogueEntry]] = {}
        for e in entries:
            up = next((p.lower() for p in e.parents if level.get(p.lower()) == e.depth - 1), None)
            children.setdefault(up if e.relation and e.depth > 1 else None, []).append(e)
        out: list[CatalogueEntry] = []
        stack = list(reversed(children.get(None, [])))
        while stack:
            e = stack.pop()
            out.append(e)
            stack.extend(reversed(children.get(e.model.lower(), [])))
        return out + [e for e in entries if e not in out]

    def as_json(self) -> dict[str, Any]:
        """The base, its revision and every candidate (kept or rejected, with the reason)."""
        return {
            "base": self.base,
            "base_sha": self.base_sha,
            "entries": [e.as_dict() for e in self.entries],
            "notes": self.notes,
        }


Progress = Callable[[str, str], None]  # (model, "kept" | "rejected: reason")
Shapes = Mapping[str, tuple[int, ...]]


class Matcher(Protocol):
    """Judges candidates against the base: the reading stage's knowledge of families
    (:class:`modelvec.read.matching.ArchitectureMatcher`), handed in so that this stage fetches and never parses."""

    def check_base(self, base: str, config: Mapping[str, Any]) -> None:
        """Raise a ModelvecError when the base's family cannot be embedded."""

    def config_match(self, base_config: Mapping[str, Any], config: Mapping[str, Any]) -> tuple[bool, str]:
        """Whether a candidate's config.json describes the base's matrices, and why."""

    def header_match(self, base_config: Mapping[str, Any], base: str, ours: Shapes, theirs: Shapes) -> tuple[bool, str]:
        """Whether a candidate's tensor shapes (``theirs``) are the base's (``ours``), and why."""


def describe(info: Any, base: str, kept: bool, reason: str) -> CatalogueEntry:
    """A catalogue entry from a huggingface_hub ``ModelInfo`` (listing or ``model_info``)."""
    card = info.card_data.to_dict() if getattr(info, "card_data", None) is not None else {}
    files = [s.rfilename for s in info.siblings or []] if getattr(info, "siblings", None) is not None else []
    labels = dataset_labels(info.id, card, info.tags or [], getattr(info, "model_index", None))
    gated = getattr(info, "gated", None)
    return CatalogueEntry(
        model=info.id,
        base=base,
        kept=kept,
        reason=reason,
        sha=info.sha,
        author=info.author or (info.id.split("/", 1)[0] if "/" in info.id else None),
        created_at=info.created_at.isoformat() if getattr(info, "created_at", None) else None,
        downloads=info.downloads,
        likes=info.likes,
        pipeline_tag=info.pipeline_tag,
        library=info.library_name,
        gated=str(gated) if gated not in (None, False) else None,
        tags=list(info.tags or []),
        files=files,
        formats=list(formats(files)),
        datasets=list(labels.datasets),
        label_source=labels.source,
        labels=[{"dataset": lb.dataset, "source": lb.source, "raw": lb.raw} for lb in labels.labels],
    )


@dataclass
class Listing:
    """One listing of discovery and how far it went: its key (``tree:<level>:<parent>`` or ``search``), the Hub query,
    the next page's address (``cursor``: the path and query the Hub's ``Link`` header gave; None: from the start) and
    whether it is done. Stored after each page (with the page's entries), so a run that stops goes on from there."""

    key: str
    query: dict[str, Any]
    cursor: str | None = None
    done: bool = False

    @property
    def level(self) -> int:
        return int(self.key.split(":")[1]) if self.key.startswith("tree:") else 0

    @property
    def parent(self) -> str:
        return self.key.split(":", 2)[2] if self.key.startswith("tree:") else ""


@dataclass
class Page:
    """What one listing page added: its entries (judged), and every listing as it stands after it (new ones queued
    for models with children). ``done``: discovery ended with this page (its entries then hold every entry, with
    the labels guessed from their siblings)."""

    base: str
    base_sha: str
    entries: list[CatalogueEntry]
    listings: list[Listing]
    done: bool = False
    notes: list[str] = field(default_factory=list)


@dataclass
class Resume:
    """What a stopped discovery left: the base's revision, the entries stored, and its listings."""

    base_sha: str
    entries: list[CatalogueEntry]
    listings: list[Listing]


def search_finetunes(
    base: str,
    scope: Scope | None = None,
    *,
    hub_settings: HubSettings | None = None,
    progress: Progress | None = None,
    matcher: Matcher,
) -> Discovery:
    """Find the fine-tunes of ``base`` on the Hub (see the module docstring for the two routes), as far as
    ``scope`` says (:class:`Scope`; default: its defaults): :func:`stream_finetunes` run to its end."""
    pages = list(stream_finetunes(base, scope, hub_settings=hub_settings, progress=progress, matcher=matcher))
    last = pages[-1]
    return Discovery(last.base, last.base_sha, last.entries, last.notes)


def stream_finetunes(
    base: str,
    scope: Scope | None = None,
    *,
    hub_settings: HubSettings | None = None,
    progress: Progress | None = None,
    matcher: Matcher,
    resume: Resume | None = None,
) -> Iterator[Page]:
    """The fine-tunes of ``base`` page by page, as the Hub lists them: each listing page judged and yielded before
    the next one is asked for, so a caller that stores each page loses at most the page in flight when stopped, and
    ``resume`` (what it stored) goes on from there. The last page is ``done`` and holds every entry.

    The declared route follows the Hub's model tree ``scope.depth`` levels down: one listing of the models that
    name a parent as their base (``base_model:<id>``: every relation at once, told apart by their tags), asked only
    for parents the Hub counts children of (``childrenModelCount``); a model is listed once, at its first level (a
    cycle in declared bases ends there, and a model that names itself is skipped). Each listing asks for everything
    the catalogue needs (:data:`EXPAND`), so no model costs a request of its own here.

    ``matcher`` judges the base and the name-search candidates (see :class:`Matcher`). ``scope.limit`` keeps at
    most that many models: declared ones first, each listing in ``scope.sort`` order, then matching name-search
    candidates. Rejected candidates are returned too, with their reason; the base itself is never a candidate.
    """
    scope = scope or Scope()
    hub_settings = hub_settings or HubSettings()
    base_id = resolve_base(base)
    try:
        if resume is not None and resume.base_sha:
            base_sha = resume.base_sha
        else:
            api = hub_settings.api()
            base_sha = str(with_retries(lambda: api.model_info(base_id.canonical), hub_settings, base_id.canonical).sha)
        base_config = _config(base_id.canonical, base_sha, hub_settings)
        matcher.check_base(base_id.canonical, base_config)
    except ModelvecError:
        raise
    except Exception as exc:
        raise ModelvecError(base_id.canonical, f"cannot read the base on the Hub: {describe_error(exc)}") from exc
    crawl = _Crawl(base_id, base_sha, base_config, scope, hub_settings, matcher, progress, resume)
    yield from crawl.pages()


class _Crawl:
    """One discovery's state: the entries found, the listings left, and how each page is judged."""

    def __init__(
        self,
        base_id: BaseId,
        base_sha: str,
        base_config: Mapping[str, Any],
        scope: Scope,
        hub_settings: HubSettings,
        matcher: Matcher,
        progress: Progress | None,
        resume: Resume | None,
    ) -> None:
        self.base_id, self.base_sha, self.base_config, self.scope = base_id, base_sha, base_config, scope
        self.hub_settings, self.matcher = hub_settings, matcher
        self.report = progress or (lambda *_: None)
        self.entries: list[CatalogueEntry] = list(resume.entries) if resume else []
        self.found = {e.model.lower(): e for e in self.entries}
        self.seen: set[str] = {base_id.canonical.lower(), *(n.lower() for n in base_id.names), *self.found}
        self.base_cache: dict[str, Any] = {"sha": base_sha}
        self.under: dict[str, str] = {}  # model (lower case) -> the parent it was first found under
        for e in self.entries:
            up = next((p for p in e.parents if (self.found.get(p.lower()) or e).depth == e.depth - 1), None)
            self.under[e.model.lower()] = up or base_id.canonical
        self.notes: list[str] = []
        self.listings = list(resume.listings) if resume and resume.listings else self._first_listings()

    def _first_listings(self) -> list[Listing]:
        tree = [Listing(f"tree:1:{name}", {"filter": f"base_model:{name}"}) for name in self.base_id.names]
        search = [Listing("search", {"search": self.base_id.search_term})] if self.scope.search else []
        return tree + search

    @property
    def kept(self) -> int:
        return sum(e.kept for e in self.entries)

    def full(self) -> bool:
        return self.scope.limit is not None and self.kept >= self.scope.limit

    def pages(self) -> Iterator[Page]:
        while not self.full():
            group = self._group()
            if not group:
                break
            feeds = [_Feed(x, self.scope, self.hub_settings) for x in group]
            new: list[CatalogueEntry] = []
            while not self.full():
                for feed in feeds:
                    feed.advance()
                    if feed.wants_page():  # a request: what was judged since the last one is stored first
                        if new:
                            yield Page(self.base_id.canonical, self.base_sha, new, self._copy())
                            new = []
                        feed.fetch()
                ready = [f for f in feeds if f.items]
                if not ready:
                    for feed in feeds:
                        feed.advance()
                    if any(f.wants_page() for f in feeds):
                        continue  # an empty page that is not the last
                    break
                feed = max(ready, key=lambda f: _sort_key(f.items[0], self.scope.sort))  # the first of the best
                entry = self._judge(feed.listing, feed.items.pop(0))
                new += [entry] if entry is not None else []
            yield Page(self.base_id.canonical, self.base_sha, new, self._copy())
        _guess_from_siblings(self.entries)
        yield Page(self.base_id.canonical, self.base_sha, list(self.entries), self._copy(), True, self.notes)

    def _group(self) -> list[Listing]:
        """The listings read together, merged in ``sort`` order: the open ones of the tree's highest open level (the
        base's names, or every parent of one level), else the name search."""
        tree = [x for x in self.listings if not x.done and x.level]
        if tree:
            level = min(x.level for x in tree)
            return [x for x in tree if x.level == level]
        return [x for x in self.listings if not x.done][:1]

    def _copy(self) -> list[Listing]:
        return [Listing(x.key, dict(x.query), x.cursor, x.done) for x in self.listings]

    def _judge(self, listing: Listing, info: Any) -> CatalogueEntry | None:
        """A listed model's entry (None: met before; a cycle is said once), its children's listing queued."""
        key = info.id.lower()
        if key in self.seen:
            if listing.level:
                self._cycle(info.id, listing.parent)
            return None
        self.seen.add(key)
        entry = self._tree_entry(listing, info) if listing.level else self._candidate(info)
        self.entries.append(entry)
        self.found[key] = entry
        self.report(entry.model, "kept" if entry.kept else f"rejected: {entry.reason}")
        return entry

    def _tree_entry(self, listing: Listing, info: Any) -> CatalogueEntry:
        names = self.base_id.names if listing.level == 1 else [listing.parent]
        tags = {t.lower() for t in info.tags or []}
        relation, name = next(
            ((r, n) for r in RELATIONS for n in names if f"base_model:{r}:{n}".lower() in tags),
            ("finetune", listing.parent),
        )
        entry = describe(info, self.base_id.canonical, True, f"declares base_model:{relation}:{name}")
        entry.relation, entry.depth = relation, listing.level
        _check_relation(entry, self.base_id, self.found)
        self.under[entry.model.lower()] = listing.parent
        children = getattr(info, "children_model_count", None)
        if listing.level < self.scope.depth and (children is None or children > 0):
            self.listings.append(
                Listing(f"tree:{listing.level + 1}:{entry.model}", {"filter": f"base_model:{entry.model}"})
            )
        return entry

    def _candidate(self, info: Any) -> CatalogueEntry:
        entry = describe(info, self.base_id.canonical, False, "")
        entry.kept, entry.reason = _check_candidate(
            entry, getattr(info, "config", None), self.base_config, self.base_id, self.base_cache, self.hub_settings,
            self.matcher,
        )  # fmt: skip
        if entry.kept:
            _check_weights(entry)
        return entry

    def _cycle(self, model: str, parent: str) -> None:
        if model.lower() == parent.lower():
            return  # a model naming itself: its entry says so
        chain = [parent]
        while chain[-1].lower() in self.under and chain[-1].lower() != model.lower() and len(chain) <= len(self.under):
            chain.append(self.under[chain[-1].lower()])
        if chain[-1].lower() == model.lower():
            path = " -> ".join([model, *reversed(chain[:-1]), model])
            note = f"{model}: a cycle of declared bases ({path}); followed once, stopped there"
            if note not in self.notes:
                self.notes.append(note)


_SORT_PARAM = {"created_at": "createdAt", "last_modified": "lastModified"}


class _Feed:
    """One listing read page by page: the models of the page in hand, and where the listing stands. Its stored
    ``cursor`` is the page in hand (models of it already judged are skipped again on resume, as met before), or,
    once that page is used up, the next one: a stopped run asks again for at most the pages it held."""

    def __init__(self, listing: Listing, scope: Scope, hub_settings: HubSettings) -> None:
        self.listing, self.scope, self.hub_settings = listing, scope, hub_settings
        self.items: list[Any] = []
        self.next: str | None = None
        self.started = False

    def advance(self) -> None:
        """The page in hand used up: the listing stands at the next page, or is done after its last."""
        if self.started and not self.items:
            self.listing.cursor, self.listing.done = self.next, self.next is None
            self.started = False

    def wants_page(self) -> bool:
        return not self.items and not self.listing.done

    def fetch(self) -> None:
        """The page the listing stands at, in hand (the listing's cursor stays on it until it is used up)."""
        self.items, self.next = _page(self.listing, self.scope, self.hub_settings)
        self.started = True


def _sort_key(info: Any, sort: str) -> Any:
    """The listing's order, to merge listings read together (the base's names; the parents of one level)."""
    attr = {"downloads": "downloads", "likes": "likes", "created_at": "created_at", "last_modified": "last_modified"}
    value = getattr(info, attr[sort], None)
    if value is None:
        return (0, 0) if sort in ("downloads", "likes") else (0, "")
    return (1, value if sort in ("downloads", "likes") else value.isoformat())


_SORT_PARAM = {"created_at": "createdAt", "last_modified": "lastModified"}


def _page(listing: Listing, scope: Scope, hub_settings: HubSettings) -> tuple[list[Any], str | None]:
    """One page of a listing from its cursor (its first page without one): its models, and the next page's path
    and query (None after the last), as the Hub's ``Link`` header gives it (huggingface_hub's own paging, made
    resumable)."""
    from huggingface_hub import ModelInfo, constants, get_session
    from huggingface_hub.utils import build_hf_headers, hf_raise_for_status

    endpoint = (hub_settings.endpoint or constants.ENDPOINT).rstrip("/")
    params: list[tuple[str, Any]] | None = [
        *listing.query.items(),
        ("sort", _SORT_PARAM.get(scope.sort, scope.sort)),
        ("direction", "-1"),
        *(("expand", e) for e in EXPAND),
    ]
    if listing.level and scope.limit is not None:
        params.append(("limit", str(scope.limit)))  # type: ignore[union-attr]
    url = f"{endpoint}/api/models"
    if listing.cursor is not None:
        url, params = endpoint + listing.cursor, None

    def get() -> Any:
        guard_hub_client()
        headers = build_hf_headers(token=hub_settings.token)
        response = get_session().get(url, params=params, headers=headers, timeout=hub_settings.timeout)
        hf_raise_for_status(response)
        return response

    response = with_retries(get, hub_settings, f"the listing {listing.key}")
    items = [ModelInfo(**{"siblings": None, **item}) for item in response.json()]
    nxt = response.links.get("next", {}).get("url")
    if not nxt:
        return items, None
    split = urlsplit(nxt)
    return items, split.path + (f"?{split.query}" if split.query else "")


def _check_relation(entry: CatalogueEntry, base_id: BaseId, found: Mapping[str, CatalogueEntry]) -> None:
    """Whether a model of the tree can be embedded against the base, by its relation and files.

    Its declared parents come from its ``base_model:<id>`` tags. A fine-tune (of the base or of a fine-tune) and
    a merge are their weights; an adapter needs its adapter files, and is its own delta on the base itself, or on a
    fine-tune of the tree (``found``, kept) that fine-tune's delta plus its own (embedded so, said so); a
    quantized repo is recorded as a quantization of its parent and never placed on the map, unless it holds
    plain float weights (a dequantized re-upload, read as weights).
    """
    entry.parents = [t.split(":", 1)[1] for t in entry.tags if t.startswith("base_model:") and t.count(":") == 1]
    root = {n.lower() for n in base_id.names}
    if any(p.lower() == entry.model.lower() for p in entry.parents):
        entry.kept, entry.reason = False, f"{entry.reason}; but names itself as its base"
        return
    if entry.relation == "quantized" and (_quantized(entry) or weight_format(entry.files) is None):
        what = ", ".join(entry.parents) or "its declared base"
        entry.kept, entry.reason = False, f"a quantization of {what} ({_quant_kind(entry)}): recorded, not mapped"
        return
    if entry.relation == "adapter" and not any(p.lower() in root for p in entry.parents):
        parent = next((found[p.lower()] for p in entry.parents if p.lower() in found), None)
        if parent is None or not parent.kept or parent.relation == "adapter":
            what = ", ".join(entry.parents) or "no declared base"
            why = "not found in the tree" if parent is None else "not mapped" if not parent.kept else "an adapter"
            entry.kept = False
            entry.reason = f"{entry.reason}; an adapter on {what} ({why}): its delta would lack its parent's"
            return
        entry.reason = f"{entry.reason}; an adapter on {parent.model}: embedded on its delta"
    _check_weights(entry)


def _quantized(entry: CatalogueEntry) -> bool:
    """Whether the repo's weights are quantized: GGUF files, or a GPTQ/AWQ/bitsandbytes quantization config."""
    names = {f.rsplit("/", 1)[-1] for f in entry.files}
    return any(f.endswith(".gguf") for f in names) or bool(names & {"quantize_config.json", "quant_config.json"})


def _quant_kind(entry: CatalogueEntry) -> str:
    if any(f.endswith(".gguf") for f in entry.files):
        return "GGUF"
    tags = {t.lower() for t in entry.tags}
    named = [kind for kind in ("gptq", "awq", "bitsandbytes", "4-bit", "8-bit") if kind in tags]
    return ", ".join(named) or "a quantized format"


def _guess_from_siblings(entries: list[CatalogueEntry]) -> None:
    """Name guesses may also use the datasets the other fine-tunes of this base declare.

    A dataset the alias table does not know ("acme-reviews") is still recognised in an
    unlabelled sibling's name ("someone/bert-acme-reviews"); the label is marked as guessed.
    """
    vocab = sorted(
        {
            d
            for e in entries
            if e.kept and e.label_source and "name" not in e.label_source.split("+")
            for d in e.datasets
        }
    )
    for e in entries:
        if not e.datasets and vocab:
            guessed = guess_from_name(e.model, known=vocab)
            if guessed:
                e.datasets, e.label_source = list(guessed), "name"
                e.labels = [{"dataset": d, "source": "name", "raw": e.model} for d in guessed]


def _check_weights(entry: CatalogueEntry) -> None:
    """A model modelvec cannot read is rejected at discovery, with what it has instead.

    Full PyTorch weights, or a PEFT adapter (``adapter_config.json`` and its weights).
    """
    if weight_format(entry.files) is None and adapter_files(entry.files) is None:
        entry.kept = False
        entry.reason = f"{entry.reason}; but no PyTorch weights (has: {', '.join(entry.formats) or 'no weight files'})"


def _check_candidate(
    entry: CatalogueEntry,
    listed: Mapping[str, Any] | None,
    base_config: Mapping[str, Any],
    base_id: BaseId,
    base_cache: dict[str, Any],
    hub_settings: HubSettings,
    matcher: Matcher,
) -> tuple[bool, str]:
    prefix = f"name search '{base_id.search_term}'"
    listed_type, base_type = (listed or {}).get("model_type"), base_config.get("model_type")
    if listed_type and base_type and str(listed_type).lower() != str(base_type).lower():
        return False, f"{prefix}; model_type '{listed_type}' is not the base's '{base_type}' (the listing's config)"
    try:
        if "config.json" in entry.files:
            ok, why = matcher.config_match(base_config, _config(entry.model, entry.sha or "main", hub_settings))
            return ok, f"{prefix}; {why}"
        if "model.safetensors" in entry.files:
            ok, why = _header_match(entry, base_id, base_config, base_cache, hub_settings, matcher)
            return ok, f"{prefix}; {why}"
        return False, f"{prefix}; no config.json or safetensors header to compare with the base"
    except Exception as exc:
        return False, f"{prefix}; could not check the config: {describe_error(exc)}"


def _config(repo_id: str, revision: str, hub_settings: HubSettings) -> dict[str, Any]:
    config = json.loads(Path(download_file(repo_id, "config.json", revision, hub_settings)).read_text())
    if not isinstance(config, dict):
        raise ValueError("config.json is not a JSON object")
    return config


def _header_match(
    entry: CatalogueEntry,
    base_id: BaseId,
    base_config: Mapping[str, Any],
    base_cache: dict[str, Any],
    hub_settings: HubSettings,
    matcher: Matcher,
) -> tuple[bool, str]:
    """Compare the shapes of the base's matrices with the candidate's safetensors header (no weights)."""
    api = hub_settings.api()

    def shapes(repo: str, revision: str | None) -> dict[str, tuple[int, ...]]:
        meta = with_retries(lambda: api.get_safetensors_metadata(repo, revision=revision), hub_settings, repo)
        return {name: tuple(t.shape) for fm in meta.files_metadata.values() for name, t in fm.tensors.items()}

    theirs = shapes(entry.model, entry.sha)
    if "shapes" not in base_cache:  # the base's header is read once per discovery
        base_cache["shapes"] = shapes(base_id.canonical, base_cache["sha"])
    return matcher.header_match(base_config, base_id.canonical, base_cache["shapes"], theirs)
