"""Every environment variable modelvec reads (``MODELVEC_*``), read here and nowhere else, as huggingface_hub keeps
its ``constants.py``.

Each is read when it is asked for, not at import: a run (or a test) may set one after modelvec is imported. An empty
value is no value. docs/commands.md lists them from :data:`ENVIRONMENT` (a test checks that it does).
"""

from __future__ import annotations

import os

STORE = "MODELVEC_STORE"
STORE_WAIT = "MODELVEC_STORE_WAIT"
DEBUG = "MODELVEC_DEBUG"
HUB_BACKOFF = "MODELVEC_HUB_BACKOFF"
HUB_TIMEOUT = "MODELVEC_HUB_TIMEOUT"
BLOCK_MB = "MODELVEC_BLOCK_MB"

#: name -> (what it means, its default): the table of docs/commands.md.
ENVIRONMENT = {
    STORE: ("The store used where a command is given no `--store`.", "`./modelvec.duckdb`"),
    STORE_WAIT: (
        "Seconds to wait while another process holds the store (`inf`: for ever); `--wait` overrides it.",
        "600 (commands that only read: 0)",
    ),
    DEBUG: ("Any value: a bug (exit status 3) shows its traceback, not one line.", "unset"),
    HUB_BACKOFF: ("Seconds before a failed Hub call is retried the first time (doubled each time, at most 30).", "1"),
    HUB_TIMEOUT: (
        "Seconds a Hub metadata call (`model_info`, the HEAD before a download) may take.",
        "huggingface_hub's `HF_HUB_ETAG_TIMEOUT` (10)",
    ),
    BLOCK_MB: (
        "Megabytes of vectors a pass of nearest lists holds at once (`cluster --neighbours lists`): the fewer, the more "
        "often a vector file larger than the memory is read again.",
        "4096, at most a quarter of the memory free",
    ),
}


def _read(name: str) -> str | None:
    return os.environ.get(name) or None


def store_path() -> str | None:
    """``$MODELVEC_STORE``, if set."""
    return _read(STORE)


def store_wait() -> float | None:
    """``$MODELVEC_STORE_WAIT`` in seconds (``inf`` waits for ever), None if unset; a ``ValueError`` in one line if
    it is not a number of seconds >= 0."""
    text = _read(STORE_WAIT)
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{STORE_WAIT}={text!r}: not a number of seconds") from None
    if value != value or value < 0:
        raise ValueError(f"{STORE_WAIT}={text!r}: give a number of seconds >= 0")
    return value


def debug() -> bool:
    """Whether ``$MODELVEC_DEBUG`` asks for a bug's traceback."""
    return _read(DEBUG) is not None


def hub_backoff() -> float:
    """``$MODELVEC_HUB_BACKOFF`` (seconds), else 1."""
    return float(_read(HUB_BACKOFF) or "1.0")


def hub_timeout(default: float) -> float:
    """``$MODELVEC_HUB_TIMEOUT`` (seconds), else ``default`` (huggingface_hub's, which the caller knows)."""
    return float(_read(HUB_TIMEOUT) or default)


def block_mb() -> float | None:
    """``$MODELVEC_BLOCK_MB``, if set; a ``ValueError`` in one line if it is not a number of megabytes > 0."""
    text = _read(BLOCK_MB)
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{BLOCK_MB}={text!r}: not a number of megabytes") from None
    if not value > 0:
        raise ValueError(f"{BLOCK_MB}={text!r}: give a number of megabytes > 0")
    return value
