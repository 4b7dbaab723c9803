"""A partial download's marker: which byte ranges of each weight file a folder holds, and each range's checksum.

One format and one parser, shared by the fetcher that writes it (:mod:`modelvec.hub.partial`) and the reader that
reads only what it lists (:mod:`modelvec.read.checkpoint`), so that neither imports the other. The marker is the file
:data:`~modelvec.core.files.PARTIAL` beside the weight files: ``{"files": {file name: [[start, stop], ...]},
"sums": {file name: {"start-stop": xxh3}}}`` (a marker of an earlier version has no ``sums``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .errors import MarkerFault
from .files import PARTIAL
from .safetensors import short_cause

__all__ = ["Marker", "MarkerFault", "marker_text", "read_marker", "span_key"]

_MAX_BYTES = 100_000_000  # as for any checkpoint's JSON: thousands of times any real marker

Spans = list[tuple[int, int]]


@dataclass
class Marker:
    """What a partial folder holds: each file's byte ranges ``[start, stop)`` and their checksums by
    :func:`span_key` (empty where the marker has none)."""

    files: dict[str, Spans] = field(default_factory=dict)
    sums: dict[str, dict[str, str]] = field(default_factory=dict)


def span_key(span: tuple[int, int]) -> str:
    """How a range is named among a file's checksums: ``"start-stop"``."""
    return f"{span[0]}-{span[1]}"


def read_marker(folder: Path) -> Marker | None:
    """The marker of ``folder`` (None: it has none); a :class:`MarkerFault` where it cannot be read (not JSON, no
    map of files to ranges). An :class:`OSError` other than the marker being absent is raised as it is."""
    path = folder / PARTIAL
    try:
        size = path.stat().st_size
        if size > _MAX_BYTES:
            raise MarkerFault(f"is {size:,} bytes, too large for a checkpoint's JSON")
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (UnicodeDecodeError, ValueError) as exc:
        if isinstance(exc, MarkerFault):
            raise
        raise MarkerFault(f"is not valid JSON ({short_cause(exc)})") from None
    except RecursionError:
        raise MarkerFault("is not valid JSON (nested too deeply)") from None
    if not isinstance(data, dict):
        raise MarkerFault("is not a JSON object")
    files = data.get("files")
    if not isinstance(files, dict):
        raise MarkerFault("lists no files")
    try:
        held = {str(name): [(int(a), int(b)) for a, b in spans] for name, spans in files.items()}
    except (TypeError, ValueError):
        raise MarkerFault("lists byte ranges that are not [start, stop] pairs") from None
    sums = data.get("sums")
    if not isinstance(sums, dict):
        sums = {}
    kept = {str(k): {str(a): str(b) for a, b in v.items()} for k, v in sums.items() if isinstance(v, dict)}
    return Marker(held, kept)


def marker_text(files: Mapping[str, Sequence[tuple[int, int]]], sums: Mapping[str, Mapping[str, str | None]]) -> str:
    """A marker's JSON text: each file's ranges (as given: merged by the writer) and their checksums."""
    return json.dumps({"files": {k: [list(s) for s in v] for k, v in files.items()}, "sums": sums})
