"""The Hugging Face Hub: base ids, settings and retries, discovery, dataset labels, model cards, downloads.

Everything goes through ``huggingface_hub``; names from the Hub are checked before they reach the
disk (:mod:`modelvec.hub.guard`). This stage fetches files and never parses weights: what makes a
checkpoint is :mod:`modelvec.core.files`, and whether a candidate matches its base is judged by a
:class:`~modelvec.hub.discovery.Matcher` handed in by the caller.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .cache import release
    from .client import HubSettings, describe_error, with_retries
    from .discovery import CatalogueEntry, Discovery, Matcher, search_finetunes
    from .download import fetch, resolve_revision
    from .ids import BaseId, resolve_base

#: Where each name lives: imported when first asked for (``huggingface_hub`` is a third of a second to import).
_HOMES = {
    "release": "cache",
    "HubSettings": "client",
    "describe_error": "client",
    "with_retries": "client",
    "CatalogueEntry": "discovery",
    "Discovery": "discovery",
    "Matcher": "discovery",
    "search_finetunes": "discovery",
    "fetch": "download",
    "resolve_revision": "download",
    "BaseId": "ids",
    "resolve_base": "ids",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
