"""Discovery with the reading stage's judgement: Hub candidates matched against the base's architecture."""

from __future__ import annotations

import os
from typing import Any

from ..core.settings import with_options
from ..hub.client import HubSettings
from ..hub.discovery import Discovery, Progress, Scope, search_finetunes
from ..read.matching import ArchitectureMatcher
from ..store import Store, opened


def discover(
    base: str,
    scope: Scope | None = None,
    *,
    store: Store | str | os.PathLike[str] | None = None,
    hub_settings: HubSettings | None = None,
    progress: Progress | None = None,
    **options: Any,
) -> Discovery:
    """Find the fine-tunes of the Hub model ``base`` as far as ``scope`` says (:class:`~modelvec.hub.discovery.Scope`;
    its settings may also be given one by one: ``discover(base, limit=10)``); see
    :func:`modelvec.hub.discovery.search_finetunes`.

    Name-search candidates are kept when their config or safetensors header has the base's
    matrices, as the architecture tables say (:class:`~modelvec.read.matching.ArchitectureMatcher`).
    With ``store``, the catalogue is stored there (stored vectors are kept; their labels refreshed).
    """
    scope = with_options(Scope, scope, options, "discover")
    found = search_finetunes(base, scope, hub_settings=hub_settings, progress=progress, matcher=ArchitectureMatcher())
    if store is not None:
        with opened(store) as db:
            db.put_catalogue(found.base, found.base_sha, found.entries)
    return found
