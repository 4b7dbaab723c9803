"""The walk of discovery: the base read once, then the model tree's listings level by level and the name search,
each page judged and yielded before the next is asked for."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from ...core.errors import ModelvecError
from ...core.tree import RELATIONS, Scope
from ..client import HubSettings, describe_error, with_retries
from ..ids import BaseId, resolve_base
from .catalogue import CatalogueEntry, Discovery, Listing, Matcher, Page, Progress, Resume, describe
from .checks import _check_candidate, _check_relation, _check_weights, _config, _guess_from_siblings
from .listing import _Feed, _sort_key


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
