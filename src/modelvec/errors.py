"""Errors that name the model and the cause in one line, so a batch run can record them and go on."""

from __future__ import annotations

import json
from typing import Any


class ModelvecError(Exception):
    """A problem with one model's input; ``str(err)`` is ``"<model>: <cause>"``."""

    def __init__(self, model: str, cause: str) -> None:
        self.model = model
        self.cause = cause
        super().__init__(f"{shown(model, None)}: {shown(cause, None)}")


def shown(value: Any, limit: int | None = 80) -> str:
    """Untrusted text (a name from a file or the Hub, a value from a header) fit for a one-line
    message: as is when printable, else escaped; cut to about ``limit`` characters (None: never)."""
    text = value if isinstance(value, str) else json.dumps(value)
    if text.isprintable() and (limit is None or len(text) <= limit):
        return text
    if limit is None:
        return repr(text)
    escaped = repr(text[:limit])  # escapes can make it 4 times longer: cut what is shown
    return escaped if len(text) <= limit and len(escaped) <= limit + 2 else escaped[:limit] + "..."


def first_line(exc: BaseException, limit: int = 160) -> str:
    """A third-party error as a short clause: its first line, shown safely."""
    text = str(exc).strip()
    return shown(text.splitlines()[0] if text else type(exc).__name__, limit)


class CheckpointError(ModelvecError):
    """The checkpoint cannot be read: missing files, bad format, missing tensor, NaN/Inf."""


class ArchitectureError(ModelvecError):
    """The architecture is unknown or its config cannot tell which family it is."""


class IncompatibleError(ModelvecError):
    """A fine-tune does not match its base: another family or another matrix shape."""
