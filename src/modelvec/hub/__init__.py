"""The Hugging Face Hub: base ids, settings and retries, discovery, dataset labels, model cards, downloads.

Everything goes through ``huggingface_hub``; names from the Hub are checked before they reach the
disk (:mod:`modelvec.hub.guard`). This stage fetches files and never parses weights: what makes a
checkpoint is :mod:`modelvec.core.files`, and whether a candidate matches its base is judged by a
:class:`~modelvec.hub.discovery.Matcher` handed in by the caller.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.lazy import lazy_exports

if TYPE_CHECKING:
    from .cache import release
    from .client import HubSettings, describe_error, with_retries
    from .discovery import CatalogueEntry, Discovery, Matcher, search_finetunes
    from .download import fetch, resolve_revision
    from .ids import BaseId, resolve_base

# each name imported when first asked for (huggingface_hub is a third of a second to import)
__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "cache": ("release",),
        "client": ("HubSettings", "describe_error", "with_retries"),
        "discovery": ("CatalogueEntry", "Discovery", "Matcher", "search_finetunes"),
        "download": ("fetch", "resolve_revision"),
        "ids": ("BaseId", "resolve_base"),
    },
)
