"""Finding the fine-tunes of a base model on the Hub, with why each was kept and what it was tuned on.

Two routes, as the description's collections were built:

1. **Declared**: models tagged ``base_model:finetune:<base>`` (the Hub derives the tag from the
   card's ``base_model:``), under the canonical id and the legacy short one; and PEFT LoRA
   adapters, tagged ``base_model:adapter:<base>``, kept when they hold ``adapter_config.json`` and
   adapter weights (format ``adapter``: :mod:`modelvec.read.adapters` embeds them like fine-tunes).
2. **Name search**: most fine-tunes from 2020-22 declare no base, so ``search=<short name>``
   candidates are kept only when their ``config.json`` matches the base (same model type, layer
   count, hidden and feed-forward sizes, heads: :attr:`Architecture.shape_keys`; vocabulary and
   head may differ). A candidate without config.json is checked from its safetensors header
   (two small range requests), never by downloading weights.

Every candidate becomes a :class:`CatalogueEntry` with the reason it was kept or rejected, its
pinned revision sha, author, counts, tags, weight formats and dataset labels with their source.
"""

from ...core.tree import Scope
from .catalogue import CatalogueEntry, Discovery, Listing, Matcher, Page, Progress, Resume, describe
from .crawl import search_finetunes, stream_finetunes

__all__ = [
    "CatalogueEntry",
    "Discovery",
    "Listing",
    "Matcher",
    "Page",
    "Progress",
    "Resume",
    "Scope",
    "describe",
    "search_finetunes",
    "stream_finetunes",
]
