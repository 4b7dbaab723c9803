"""Writing a command's outputs (figures, pages, tables, JSON): whole or not at all, a failure naming the file; JSON
strict, so that every parser reads it."""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def write_atomically(path: Path, write: Callable[[str], Any]) -> Path:
    """Write through a temporary file beside ``path`` and rename it into place: a reader never sees half a file.

    An ``OSError`` (a read-only folder, a full disk) names ``path``: not the temporary file, and a write that
    fails on a full disk names none."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        write(tmp)
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600
        os.replace(tmp, path)
    except BaseException as exc:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc
        raise
    return path


def json_text(value: Any) -> str:
    """``value`` as strict JSON (RFC 8259), which JavaScript's ``JSON.parse`` and jq read: an undefined score (NaN)
    and the infinities as ``null``, numpy's numbers and arrays as JSON's. Python's own ``json`` writes ``NaN``, which
    no other parser accepts; anything else that is not JSON is a ``TypeError`` (a bug)."""
    return json.dumps(_strict(value), allow_nan=False)


def _strict(value: Any) -> Any:
    """``value`` with every float that JSON cannot hold made None, and numpy's values made Python's."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):  # numpy's float64 too
        return float(value) if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _strict(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(item) for item in value]
    np = sys.modules.get("numpy")  # not imported: no numpy value can be here
    if np is not None and isinstance(value, (np.generic, np.ndarray)):
        return _strict(value.tolist())  # a scalar's tolist() is its Python value
    return value
