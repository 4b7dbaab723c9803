"""Hub model ids: the description's short base names and the Hub's canonical ones, and commit shas."""

from __future__ import annotations

import re
from dataclasses import dataclass

#: The description's short ids and the Hub's canonical ids (the Hub moved legacy ids under orgs).
#: A short id resolves to its canonical one; any other ``org/name`` is taken as written.
CANONICAL_BASES: dict[str, str] = {
    "bert-base-uncased": "google-bert/bert-base-uncased",
    "bert-base-cased": "google-bert/bert-base-cased",
    "bert-large-uncased": "google-bert/bert-large-uncased",
    "bert-large-cased": "google-bert/bert-large-cased",
    "bert-base-multilingual-cased": "google-bert/bert-base-multilingual-cased",
    "bert-base-multilingual-uncased": "google-bert/bert-base-multilingual-uncased",
    "roberta-base": "FacebookAI/roberta-base",
    "roberta-large": "FacebookAI/roberta-large",
    "xlm-roberta-base": "FacebookAI/xlm-roberta-base",
    "xlm-roberta-large": "FacebookAI/xlm-roberta-large",
    "distilbert-base-uncased": "distilbert/distilbert-base-uncased",
    "distilbert-base-cased": "distilbert/distilbert-base-cased",
    "distilroberta-base": "distilbert/distilroberta-base",
    "t5-small": "google-t5/t5-small",
    "t5-base": "google-t5/t5-base",
    "t5-large": "google-t5/t5-large",
    "gpt2": "openai-community/gpt2",
    "gpt2-medium": "openai-community/gpt2-medium",
    "gpt2-large": "openai-community/gpt2-large",
    "gpt2-xl": "openai-community/gpt2-xl",
    "distilgpt2": "distilbert/distilgpt2",
    "all-MiniLM-L6-v2": "sentence-transformers/all-MiniLM-L6-v2",
}
_SHORT_BY_CANONICAL = {v.lower(): k for k, v in CANONICAL_BASES.items()}
_SHORT_BY_LOWER = {k.lower(): v for k, v in CANONICAL_BASES.items()}
_SHA = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class BaseId:
    """A base model as the Hub knows it: the canonical id and the names fine-tunes use for it."""

    canonical: str
    short: str | None = None

    @property
    def names(self) -> tuple[str, ...]:
        """Every id a card's ``base_model:`` may use for this base (canonical first)."""
        return (self.canonical,) + ((self.short,) if self.short else ())

    @property
    def search_term(self) -> str:
        """The name fine-tunes of 2020-22 put in their repo names: ``bert-base-uncased``."""
        return self.short or self.canonical.split("/", 1)[-1]


def resolve_base(base: str) -> BaseId:
    """``bert-base-uncased`` and ``google-bert/bert-base-uncased`` both give the same :class:`BaseId`."""
    text = base.strip().strip("/")
    if not text:
        raise ValueError("empty base model id")
    if text.lower() in _SHORT_BY_LOWER:
        canonical = _SHORT_BY_LOWER[text.lower()]
        return BaseId(canonical, _SHORT_BY_CANONICAL[canonical.lower()])
    if text.lower() in _SHORT_BY_CANONICAL:
        short = _SHORT_BY_CANONICAL[text.lower()]
        return BaseId(CANONICAL_BASES[short], short)
    return BaseId(text, None)


def is_commit_sha(revision: str | None) -> bool:
    return bool(revision) and bool(_SHA.fullmatch(str(revision)))
