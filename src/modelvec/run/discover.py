"""Discovery with the reading stage's judgement: Hub candidates matched against the base's architecture."""

from __future__ import annotations

import os
from typing import Any

from ..hub.discovery import Discovery, search_finetunes
from ..read.matching import ArchitectureMatcher
from ..store import Store, opened


def discover(base: str, *, store: Store | str | os.PathLike[str] | None = None, **kwargs: Any) -> Discovery:
    """Find the fine-tunes of the Hub model ``base`` (see :func:`modelvec.hub.discovery.search_finetunes`).

    Name-search candidates are kept when their config or safetensors header has the base's
    matrices, as the architecture tables say (:class:`~modelvec.read.matching.ArchitectureMatcher`).
    With ``store``, the catalogue is stored there (stored vectors are kept; their labels refreshed).
    """
    kwargs.setdefault("matcher", ArchitectureMatcher())
    found = search_finetunes(base, **kwargs)
    if store is not None:
        with opened(store) as db:
            db.put_catalogue(found.base, found.base_sha, found.entries)
    return found
