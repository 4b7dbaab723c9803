"""A model's dataset labels from each source the Hub offers (model-index, card, tags, the repo name), in priority
order, each with its provenance; and the filter on provenance."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .aliases import COLLECTION_CONFIGS
from .names import _CONFIG_KEYS, _drop_general, _scan, _tokens, guess_from_name, normalise_dataset

SOURCES = ("model-index", "card", "tag", "name")  # priority order; "name" = guessed
_DECLARED = SOURCES[:-1]
_FILTERS = ("declared", "guessed", "none")  # matches_source's words beyond the source names


@dataclass(frozen=True)
class Label:
    """One dataset label with its provenance."""

    dataset: str  # normalised name, e.g. "glue/sst2"
    source: str  # one of SOURCES
    raw: str  # what the source said, e.g. "SST-2", "glue (config sst2)", the repo name


@dataclass(frozen=True)
class Labels:
    """A model's final dataset labels, and every (dataset, source, raw) that contributed to them."""

    datasets: tuple[str, ...]  # deduplicated, in first-seen priority order
    source: str | None  # contributing sources joined with "+" in SOURCES order; None when no labels
    labels: tuple[Label, ...]

    @property
    def guessed(self) -> bool:
        """True when the repo-name guess contributed (alone, or to refine a bare collection)."""
        return self.source is not None and "name" in self.source.split("+")


def _as_list(value: Any) -> list[Any]:
    """A YAML field that may be one item or a list of them."""
    if isinstance(value, (list, tuple)):
        return list(value)
    if value is None:
        return []
    return [value]


def _text(value: Any) -> str | None:
    return value.strip() or None if isinstance(value, str) else None


def _model_index_labels(model_index: Any) -> list[Label]:
    out = []
    for entry in _as_list(model_index):
        if not isinstance(entry, Mapping):
            continue
        for result in _as_list(entry.get("results")):
            if not isinstance(result, Mapping):
                continue
            dataset = result.get("dataset")
            if isinstance(dataset, str):
                dataset = {"type": dataset}
            if not isinstance(dataset, Mapping):
                continue
            ident = _text(dataset.get("type")) or _text(dataset.get("name"))
            if ident is None:
                continue
            config = _text(dataset.get("config")) or _text(dataset.get("args"))
            normalised = normalise_dataset(ident, config)
            if normalised:
                out.append(Label(normalised, "model-index", f"{ident} (config {config})" if config else ident))
    return out


def _card_labels(card: Mapping[str, Any]) -> list[Label]:
    out = []
    for item in _as_list(card.get("datasets")):
        raw = _text(item)
        if raw is not None and (normalised := normalise_dataset(raw)):
            out.append(Label(normalised, "card", raw))
    return out


def _tag_labels(tags: Any) -> list[Label]:
    out = []
    for tag in [tags] if isinstance(tags, str) else _as_list(tags):
        raw = _text(tag)
        if raw is None or not raw.lower().startswith("dataset:"):
            continue
        if normalised := normalise_dataset(raw[len("dataset:") :]):
            out.append(Label(normalised, "tag", raw))
    return out


def _refine(labels: Sequence[Label]) -> list[Label]:
    """Rewrite a general label into the specific ones present, keeping its source and raw text."""
    datasets = list(dict.fromkeys(label.dataset for label in labels))
    out: list[Label] = []
    for label in labels:
        specific = [d for d in datasets if d.startswith(label.dataset + "/")]
        for dataset in _drop_general(specific) or [label.dataset]:
            refined = Label(dataset, label.source, label.raw)
            if refined not in out:
                out.append(refined)
    return out


def _refine_by_name(labels: list[Label], repo_id: str) -> list[Label]:
    """Declared labels that are only bare collections take their config from the repo name."""
    if not labels or any(label.dataset not in COLLECTION_CONFIGS for label in labels):
        return labels
    tokens = _tokens(repo_id)
    out: list[Label] = []
    named: list[Label] = []
    for label in labels:
        configs = _scan(tokens, _CONFIG_KEYS[label.dataset])
        if not configs:
            out.append(label)
        out.extend(Label(c, label.source, label.raw) for c in configs)
        named.extend(Label(c, "name", repo_id) for c in configs)
    return list(dict.fromkeys(out + named))


def _assemble(labels: Sequence[Label]) -> Labels:
    """``labels`` arrive in priority order (declared sources first, name last)."""
    datasets = tuple(dict.fromkeys(label.dataset for label in labels))
    sources = [s for s in SOURCES if any(label.source == s for label in labels)]
    return Labels(datasets, "+".join(sources) or None, tuple(labels))


def dataset_labels(
    repo_id: str, card: Mapping[str, Any] | None = None, tags: Sequence[str] | None = None, model_index: Any = None
) -> Labels:
    """A model's dataset labels from what the Hub says about it, most specific source first.

    ``model_index`` (when not None) replaces the card's ``model-index:``. The repo name is consulted
    only when the card, model-index and tags declare nothing, or to pick the config of a declared
    bare collection (then "name" joins the source and ``guessed`` is True).
    """
    if not isinstance(card, Mapping):
        card = {}
    if model_index is None:
        model_index = card.get("model-index")
    repo = repo_id if isinstance(repo_id, str) else ""
    card_labels = _card_labels(card)
    # The Hub derives `dataset:` tags from the card's datasets: they count only without one.
    declared = _refine(_model_index_labels(model_index) + card_labels + ([] if card_labels else _tag_labels(tags)))
    if declared:
        return _assemble(_refine_by_name(declared, repo))
    return _assemble([Label(d, "name", repo) for d in guess_from_name(repo)])


def matches_source(source: str | None, wanted: Iterable[str]) -> bool:
    """Filter on provenance: does a model whose labels came from ``source`` pass any ``wanted`` item?

    Items: a source name ("model-index", "card", "tag", "name": that source contributed), a joined
    source exactly ("model-index+card"), "declared" (labels, none of them from the name),
    "guessed" ("name" contributed) or "none" (no labels). Non-string items are skipped; an unknown
    word raises ValueError, since a misspelt filter silently matching nothing would mislead.
    """
    parts = set(source.split("+")) if isinstance(source, str) and source else set()
    items = [wanted] if isinstance(wanted, str) else list(wanted) if isinstance(wanted, Iterable) else []
    for item in items:
        if not isinstance(item, str):
            continue
        word = item.strip().lower().replace("model_index", "model-index")
        if word in SOURCES:
            hit = word in parts
        elif word == "declared":  # wholly declared: a label refined by the name is partly guessed
            hit = bool(parts) and "name" not in parts
        elif word == "guessed":
            hit = "name" in parts
        elif word == "none":
            hit = not parts
        elif word and set(word.split("+")) <= set(SOURCES):
            hit = word == source
        else:
            raise ValueError(f"unknown label source filter {item!r}; use one of {SOURCES + _FILTERS}")
        if hit:
            return True
    return False
