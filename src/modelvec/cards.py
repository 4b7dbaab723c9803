"""Model cards: the YAML front matter of a model's README.md, where the dataset labels come from."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


def read_card(folder: str | Path) -> dict[str, Any]:
    """The front matter of ``folder/README.md`` as a dict; empty when there is none or it is not YAML."""
    readme = Path(folder) / "README.md"
    try:
        text = readme.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    if not text.startswith("---"):
        return {}
    end = text.find("\n---", 3)
    if end < 0:
        return {}
    try:
        data = yaml.safe_load(text[3:end])
    except yaml.YAMLError:
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
