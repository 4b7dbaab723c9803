"""The Hugging Face Hub: base ids, settings and retries, discovery, dataset labels, model cards, downloads.

Everything goes through ``huggingface_hub``; names from the Hub are checked before they reach the
disk (:mod:`modelvec.hub.guard`). This stage fetches files and never parses weights: what makes a
checkpoint is :mod:`modelvec.core.files`, and whether a candidate matches its base is judged by a
:class:`~modelvec.hub.discovery.Matcher` handed in by the caller.
"""

from .cache import release
from .client import HubSettings, describe_error, with_retries
from .discovery import CatalogueEntry, Discovery, Matcher, search_finetunes
from .download import fetch, resolve_revision
from .ids import BaseId, resolve_base

__all__ = [
    "BaseId",
    "CatalogueEntry",
    "Discovery",
    "HubSettings",
    "Matcher",
    "describe_error",
    "fetch",
    "release",
    "resolve_base",
    "resolve_revision",
    "search_finetunes",
    "with_retries",
]
