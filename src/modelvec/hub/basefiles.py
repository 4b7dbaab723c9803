"""A Hub base's files on this machine, at the version its stored vectors were embedded against: what the reports
read of the base (its per-block heat map, the explanation of a neighbour)."""

from __future__ import annotations

from pathlib import Path

from ..core.errors import ModelvecError
from .client import HubSettings


def base_files(name: str, base_version: str, hub_settings: HubSettings, *, fetch: bool = False) -> str | None:
    """The Hub base ``name``'s snapshot in the Hub cache, or the rows of it that embed fetched, at ``base_version``
    (``git:<sha>``; another: its main branch); with ``fetch``, one not in the cache is fetched (``neighbors
    --explain``; ``cluster`` works offline: None)."""
    from ..core.files import weight_format
    from .cache import snapshot_folder
    from .download import fetch as fetch_files
    from .partial import partial_folder

    sha = base_version.removeprefix("git:") if base_version.startswith("git:") else "main"
    folder: Path | None
    try:
        folder = snapshot_folder(name, sha, hub_settings)
        if folder is None or not weight_format(p.name for p in folder.iterdir()):
            folder = partial_folder(name, sha, hub_settings) if sha != "main" else folder
        if (folder is None or not folder.is_dir()) and fetch:
            folder = fetch_files(name, sha, None, hub_settings)
    except (ModelvecError, OSError):
        if fetch:
            raise
        return None  # an unreadable cache is no heat map, not a failed report
    return str(folder) if folder is not None and folder.is_dir() else None
