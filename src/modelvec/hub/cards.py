"""Model cards: the YAML front matter of a model's README.md, where the dataset labels come from."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from huggingface_hub import metadata_load


def read_card(folder: str | Path) -> dict[str, Any]:
    """The front matter of ``folder/README.md`` (huggingface_hub's ``metadata_load``) as a dict; empty when
    there is none, it is not YAML, or the file cannot be read: a card never fails a model."""
    try:
        data = metadata_load(Path(folder) / "README.md")
    except (OSError, UnicodeDecodeError, ValueError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def card_datasets(card: dict[str, Any]) -> list[str]:
    """The card's ``datasets:`` as a list of strings (a single string is accepted too)."""
    value = card.get("datasets")
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        return []
    return [str(v).strip() for v in value if isinstance(v, (str, int)) and str(v).strip()]


def card_author(card: dict[str, Any]) -> str | None:
    """An ``author:`` the card declares (local models have no Hub namespace to take it from)."""
    value = card.get("author")
    return str(value).strip() or None if isinstance(value, (str, int)) else None
