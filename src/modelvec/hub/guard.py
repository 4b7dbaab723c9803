"""Names from the Hub are not trusted as file names.

huggingface_hub builds cache paths from the ``ETag`` and ``X-Repo-Commit`` headers of a file's HEAD
and from the revision it is asked for, so a hostile endpoint (a mirror in ``HF_ENDPOINT``, a proxy)
answering ``ETag: "../../../x"``, or a listing whose ``sha`` is ``../../../x``, would make it write
outside the cache. :func:`guard_hub_client` (called before every Hub call modelvec makes) adds hooks
to huggingface_hub's shared HTTP client (``huggingface_hub.get_session()``, httpx's public
``event_hooks``) that refuse both. A client made afresh (``set_client_factory``, ``close_session``)
gets them again at modelvec's next call; the user's own factory is kept as it is.
"""

from __future__ import annotations

import threading
from urllib.parse import unquote

from ..core.errors import UnsafeHubName

#: Headers of a file's HEAD that huggingface_hub turns into cache paths (blobs/<etag>, snapshots/<commit>,
#: .no_exist/<commit>/...).
_PATH_HEADERS = ("ETag", "X-Linked-Etag", "X-Repo-Commit")
_GUARD_LOCK = threading.Lock()


def _unsafe_name(value: str) -> bool:
    return (
        not value
        or value in (".", "..")
        or len(value) > 255
        or any(c in "/\\:" or ord(c) < 32 or ord(c) == 127 for c in value)
    )


def check_request(request) -> None:
    """Refuse to resolve a file at a revision that is no git ref and would be a path (an httpx request hook).

    huggingface_hub stores ``refs/<revision>`` in the cache for the revision it is asked for; git refs never
    hold ``..`` segments, backslashes or control characters, nor start with ``/``.
    """
    if request.method not in ("HEAD", "GET"):
        return
    segments = request.url.raw_path.split(b"?", 1)[0].decode("ascii", "replace").split("/")
    for i, segment in enumerate(segments[:-1]):
        if segment == "resolve":
            revision = unquote(segments[i + 1])
            if (
                revision.startswith("/")
                or any(p in ("", ".", "..") for p in revision.split("/"))
                or any(c == "\\" or ord(c) < 32 or ord(c) == 127 for c in revision)
            ):
                raise UnsafeHubName(f"refused to ask for revision {revision[:80]!r}, which is no git ref")


def check_answer(response) -> None:
    """Refuse a HEAD answer whose ETag or commit header would not be a plain file name (an httpx response hook)."""
    if response.request.method != "HEAD":
        return
    for header in _PATH_HEADERS:
        value = response.headers.get(header)
        if value is None:
            continue
        name = value.lstrip("W/").strip('"') if "etag" in header.lower() else value  # as huggingface_hub reads it
        if _unsafe_name(name):
            raise UnsafeHubName(
                f"the Hub answered {header}: {value[:80]!r} for {response.request.url.path[:200]}, "
                "which is not a safe file name; refused"
            )


def guard_hub_client() -> None:
    """Make huggingface_hub's shared HTTP client check requests and answers (:func:`check_request`,
    :func:`check_answer`): the hooks are added to the client ``get_session()`` returns, once per client.
    Idempotent and thread-safe; cheap once installed."""
    from huggingface_hub import get_session

    client = get_session()
    if check_answer in client.event_hooks.get("response", []):
        return
    with _GUARD_LOCK:
        client = get_session()
        if check_answer not in client.event_hooks.get("response", []):
            _add_hook(client)


def _add_hook(client):
    hooks = dict(client.event_hooks)
    hooks["request"] = [*hooks.get("request", []), check_request]
    hooks["response"] = [*hooks.get("response", []), check_answer]
    client.event_hooks = hooks
    return client
