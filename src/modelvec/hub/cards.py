"""Model cards: the YAML front matter of a model's README.md, where the dataset labels come from
(read by :func:`modelvec.hub.labels.dataset_labels`, for local and Hub models alike)."""

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


def card_author(card: dict[str, Any]) -> str | None:
    """An ``author:`` the card declares (local models have no Hub namespace to take it from)."""
    value = card.get("author")
    return str(value).strip() or None if isinstance(value, (str, int)) else None
