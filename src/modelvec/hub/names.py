"""Nothing the Hub says is trusted as a path: repository ids, revisions, file names and the shard names of an index
are checked here before they reach the disk (huggingface_hub refuses ``..`` and absolute file names but writes
``refs/<revision>`` for any revision it is given)."""

from __future__ import annotations

import re
from typing import Any

from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id

from ..core.errors import CheckpointError, FetchError
from ..core.files import SHARD_SUFFIX
from .ids import is_commit_sha

_REF = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*(/[A-Za-z0-9_][A-Za-z0-9._-]*)*")


def check_repo_id(repo_id: str) -> str:
    """``repo_id`` if it is a valid Hub id (``name`` or ``owner/name``, no ``..``); a FetchError otherwise."""
    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        raise FetchError(str(repo_id)[:200], f"not a valid Hub repository id: {str(exc).splitlines()[0]}") from None
    return repo_id


def check_revision(repo_id: str, revision: str) -> str:
    """A commit sha or a plain ref name (``main``, ``refs/pr/1``): nothing that could be a path elsewhere."""
    text = str(revision)
    if is_commit_sha(text) or (len(text) <= 255 and _REF.fullmatch(text) and ".." not in text):
        return text
    raise FetchError(repo_id, f"the Hub gave an unusable revision {text[:80]!r} (not a commit sha or a ref name)")


def check_filename(repo_id: str, name: str) -> str:
    """A file name from the Hub that stays inside a snapshot folder: relative, ``/``-separated, no ``..``."""
    parts = name.split("/") if isinstance(name, str) else []
    bad = (
        not parts
        or len(name) > 1024
        or name.startswith("/")
        or any(p in ("", ".", "..") or len(p.encode("utf-8", "surrogatepass")) > 255 for p in parts)
        or any(c in "\\:" or ord(c) < 32 or ord(c) == 127 for c in name)
    )
    if bad:
        raise FetchError(repo_id, f"refused the file name {str(name)[:80]!r} from the Hub: not a plain relative path")
    return name


def shard_names(repo_id: str, fmt: str, index: Any, marker: str) -> list[str]:
    """The shard files an index names, each checked (a safe name with the format's suffix)."""
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointError(repo_id, f"{marker} has no weight_map of tensor -> file name")
    shards = sorted(set(weight_map.values()))
    if not shards:
        raise CheckpointError(repo_id, f"{marker} lists no shards")
    for shard in shards:
        check_filename(repo_id, shard)
        if not shard.endswith(SHARD_SUFFIX[fmt]):
            raise CheckpointError(repo_id, f"{marker} names {shard[:80]!r}, not a {SHARD_SUFFIX[fmt]} shard")
    return shards
