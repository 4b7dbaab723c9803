"""Writing a command's outputs (figures, pages, tables): whole or not at all, a failure naming the file."""

from __future__ import annotations

import os
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
