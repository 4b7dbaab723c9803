"""How models are named: a local one by its absolute path, a Hub one by its repository id."""

from __future__ import annotations

import os
import re
from pathlib import Path

PathLike = str | os.PathLike[str]

_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")


def is_hub_id(model: object) -> bool:
    """A string that names a Hub repository (``org/name`` or a legacy ``name``) and no local path."""
    text = str(model)
    return not os.path.exists(text) and bool(_HUB_ID.fullmatch(text)) and ".." not in text


def model_id(model: PathLike) -> str:
    """How the store names a model: a local one by its absolute path, a Hub one by its repo id."""
    return str(model) if is_hub_id(model) else str(Path(model).resolve())


def display_name(model: PathLike) -> str:
    """A readable name for a model or base: a local folder named just "model" is named with its parent."""
    path = Path(model)
    return f"{path.parent.name}/{path.name}" if path.name in ("model", "base", "") and path.parent.name else path.name
