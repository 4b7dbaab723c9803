"""What discovery finds and hands on: a catalogue entry per candidate, the whole discovery, the listings and pages
of a discovery under way (stored, so that a stopped one goes on), and the matcher it is handed."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from ...core.files import formats
from ..labels import dataset_labels


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
