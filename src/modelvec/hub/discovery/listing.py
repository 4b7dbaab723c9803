"""The Hub's listing of models, page by page: what one call asks for, its order, and a listing read from its stored
cursor (huggingface_hub's own paging, made resumable)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from ...core.tree import Scope
from ..client import HubSettings, with_retries
from ..guard import guard_hub_client
from .catalogue import Listing

#: What one listing call asks for, so no per-model call is needed: the card, the files, the revision, the parents
#: (``baseModels``), how many models name this one as their base (``childrenModelCount``: a model without children
#: costs no listing of its own), and ``config`` (``model_type`` and ``architectures``: a name-search candidate of
#: another family is rejected without fetching its config.json); ``safetensors`` (parameter counts) and ``gguf``
#: are asked for as the catalogue's (the reader still needs a file's own header for its shapes).
EXPAND = [
    "author",
    "baseModels",
    "cardData",
    "childrenModelCount",
    "config",
    "createdAt",
    "downloads",
    "gated",
    "gguf",
    "lastModified",
    "library_name",
    "likes",
    "model-index",
    "pipeline_tag",
    "private",
    "safetensors",
    "sha",
    "siblings",
    "tags",
]


_SORT_PARAM = {"created_at": "createdAt", "last_modified": "lastModified"}


class _Feed:
    """One listing read page by page: the models of the page in hand, and where the listing stands. Its stored
    ``cursor`` is the page in hand (models of it already judged are skipped again on resume, as met before), or,
    once that page is used up, the next one: a stopped run asks again for at most the pages it held."""

    def __init__(self, listing: Listing, scope: Scope, hub_settings: HubSettings) -> None:
        self.listing, self.scope, self.hub_settings = listing, scope, hub_settings
        self.items: list[Any] = []
        self.next: str | None = None
        self.started = False

    def advance(self) -> None:
        """The page in hand used up: the listing stands at the next page, or is done after its last."""
        if self.started and not self.items:
            self.listing.cursor, self.listing.done = self.next, self.next is None
            self.started = False

    def wants_page(self) -> bool:
        return not self.items and not self.listing.done

    def fetch(self) -> None:
        """The page the listing stands at, in hand (the listing's cursor stays on it until it is used up)."""
        self.items, self.next = _page(self.listing, self.scope, self.hub_settings)
        self.started = True


def _sort_key(info: Any, sort: str) -> Any:
    """The listing's order, to merge listings read together (the base's names; the parents of one level)."""
    attr = {"downloads": "downloads", "likes": "likes", "created_at": "created_at", "last_modified": "last_modified"}
    value = getattr(info, attr[sort], None)
    if value is None:
        return (0, 0) if sort in ("downloads", "likes") else (0, "")
    return (1, value if sort in ("downloads", "likes") else value.isoformat())


def _page(listing: Listing, scope: Scope, hub_settings: HubSettings) -> tuple[list[Any], str | None]:
    """One page of a listing from its cursor (its first page without one): its models, and the next page's path
    and query (None after the last), as the Hub's ``Link`` header gives it (huggingface_hub's own paging, made
    resumable)."""
    from huggingface_hub import ModelInfo, constants, get_session
    from huggingface_hub.utils import build_hf_headers, hf_raise_for_status

    endpoint = (hub_settings.endpoint or constants.ENDPOINT).rstrip("/")
    params: list[tuple[str, Any]] | None = [
        *listing.query.items(),
        ("sort", _SORT_PARAM.get(scope.sort, scope.sort)),
        ("direction", "-1"),
        *(("expand", e) for e in EXPAND),
    ]
    if listing.level and scope.limit is not None:
        params.append(("limit", str(scope.limit)))  # type: ignore[union-attr]
    url = f"{endpoint}/api/models"
    if listing.cursor is not None:
        url, params = endpoint + listing.cursor, None

    def get() -> Any:
        guard_hub_client()
        headers = build_hf_headers(token=hub_settings.token)
        response = get_session().get(url, params=params, headers=headers, timeout=hub_settings.timeout)
        hf_raise_for_status(response)
        return response

    response = with_retries(get, hub_settings, f"the listing {listing.key}")
    items = [ModelInfo(**{"siblings": None, **item}) for item in response.json()]
    nxt = response.links.get("next", {}).get("url")
    if not nxt:
        return items, None
    split = urlsplit(nxt)
    return items, split.path + (f"?{split.query}" if split.query else "")
