"""Model cards: the YAML front matter of a model's README.md, where the dataset labels come from
(read by :func:`modelvec.hub.labels.dataset_labels`, for local and Hub models alike)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import xxhash
import yaml
from huggingface_hub.repocard import REGEX_YAML_BLOCK

from .labels import dataset_labels

CARD = "README.md"


def read_card(folder: str | Path) -> dict[str, Any]:
    """The front matter of ``folder/README.md`` as a dict; empty when there is none or it cannot be read: a card
    never fails a model (:func:`card_of` also says why one could not be read)."""
    return card_of(folder)[0]


def card_of(folder: str | Path) -> tuple[dict[str, Any], str | None]:
    """The front matter of ``folder/README.md`` as huggingface_hub's ``metadata_load`` reads it (the first
    ``---`` block, YAML), and why it could not be read: None where it was, or where there is no card or no front
    matter. A card that cannot be read leaves the model unlabelled, never failed, but is said (``embed``'s notes),
    so that a missing label is not taken for a card that declares none."""
    path = Path(folder) / CARD
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        return {}, None
    except UnicodeDecodeError:
        return {}, f"{CARD} is not UTF-8 text"
    except OSError as exc:
        return {}, f"{CARD} could not be read ({(exc.strerror or str(exc)).lower()})"
    match = REGEX_YAML_BLOCK.search(text)
    if match is None:
        return {}, None
    try:
        data = yaml.safe_load(match.group(2))
    except yaml.YAMLError as exc:
        fault = _yaml_fault(exc, before=text[: match.start(2)].count("\n"))
        return {}, f"{CARD}'s front matter is not valid YAML: {fault}"
    if data is None or isinstance(data, dict):
        return data or {}, None
    return {}, f"{CARD}'s front matter is a YAML {type(data).__name__}, not a mapping of fields"


def _yaml_fault(exc: yaml.YAMLError, before: int) -> str:
    """A YAML error in one clause, at its line of the README (the front matter starts after ``before`` lines)."""
    problem = getattr(exc, "problem", None) or (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    mark = getattr(exc, "problem_mark", None)
    return f"{problem} (line {before + mark.line + 1}, column {mark.column + 1})" if mark is not None else problem


def card_author(card: dict[str, Any]) -> str | None:
    """An ``author:`` the card declares (local models have no Hub namespace to take it from)."""
    value = card.get("author")
    return str(value).strip() or None if isinstance(value, (str, int)) else None


@dataclass(frozen=True)
class ModelCard:
    """What a model's card says, read once: an xxh3 of its bytes (``digest``; "" where there is no card, None where
    it was not read: a Hub model's catalogue entry speaks for it), its dataset labels and their source, its author,
    the relation it declares (``base_model_relation``; None: not said) and the parents it names (``base_model``),
    and why it could not be read (``problem``: the model is unlabelled, never failed)."""

    digest: str | None
    datasets: list[str]
    label_source: str | None
    author: str | None
    relation: str | None
    parents: list[str]
    problem: str | None = None

    def note(self, name: str) -> str | None:
        """What a run says once of a card that could not be read."""
        if self.problem is None:
            return None
        unlabelled = "labelled from its name alone" if self.datasets else "embedded without labels"
        return f"{name}: its model card was not read ({self.problem}): {unlabelled}"


def model_card(folder: str | Path, name: str) -> ModelCard:
    """The card of the model ``name`` in ``folder`` (its README.md), read once."""
    try:
        digest = xxhash.xxh3_64_hexdigest((Path(folder) / CARD).read_bytes())
    except FileNotFoundError:
        digest = ""
    except OSError:
        digest = None
    card, problem = card_of(folder)
    found = dataset_labels(Path(name).name, card)  # the one path a Hub model's card takes too
    said = card.get("base_model")
    parents = [said] if isinstance(said, str) else [str(p) for p in said] if isinstance(said, list) else []
    relation = card.get("base_model_relation")
    return ModelCard(
        digest,
        list(found.datasets),
        found.source,
        card_author(card),
        str(relation) if isinstance(relation, str) and relation else None,
        [p for p in parents if p],
        problem,
    )
