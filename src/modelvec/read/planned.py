"""Which bytes of a checkpoint's files are read: the byte ranges of its read plan (the stored rows of each tensor a
vector reads), worked out once per checkpoint; whether a partial download holds them (its marker:
:mod:`modelvec.core.partial`); and the kernel asked to read them ahead."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..core.errors import CheckpointError, raise_if_resource, shown
from ..core.files import PARTIAL
from ..core.partial import MarkerFault, read_marker
from ..core.spans import merge, missing
from .headers import row_bytes
from .headers import short_cause as _short

Rows = Mapping[str, Sequence[tuple[int, int]]]
Spans = dict[Path, list[tuple[int, int]]]


class PlannedReads:
    """What a :class:`~modelvec.read.checkpoint.Checkpoint` knows of the bytes it is read by: the byte ranges held
    (``fetched``: a partial download's; None: whole files) and those of its read plan (:meth:`plan_reads`)."""

    name: str
    folder: Path
    files: list[Path]
    fetched: Spans | None
    _data_starts: dict[Path, int]
    #: The stored rows of each tensor this checkpoint is read for (:meth:`plan_reads`), merged; None: no plan.
    reads: dict[str, list[tuple[int, int]]] | None = None
    _spans: Spans | None = None  # the plan's byte ranges, worked out once
    _held_checked = False  # the plan's byte ranges were found held

    def _file_of(self, key: str) -> Path:
        raise NotImplementedError

    def _header(self, file: Path) -> dict[str, Any] | None:
        raise NotImplementedError

    def _read_partial(self) -> Spans | None:
        """The byte ranges held of each weight file where they are a partial download (None: whole files)."""
        try:
            marker = read_marker(self.folder)
        except MarkerFault as fault:
            raise CheckpointError(self.name, f"{PARTIAL} {fault}") from None
        except OSError as exc:
            raise_if_resource(exc, self.name)
            raise CheckpointError(self.name, f"{PARTIAL} is not valid JSON ({_short(exc)})") from None
        if marker is None:
            return None
        return {self.folder / name: sorted(ranges) for name, ranges in marker.files.items()}

    def refresh_held(self) -> None:
        """Read again what a partial download holds (after a fetch added to it)."""
        self.fetched = self._read_partial()
        self._held_checked = False

    def plan_reads(self, rows: Rows) -> Spans | None:
        """Say which stored rows of each tensor this checkpoint is read for (its read plan): their byte ranges are
        worked out here, once, and are what a partial download fetches, what :meth:`prefetch` asks the kernel for,
        and what :meth:`require_rows` checks are held (rows within the plan are not worked out again). None where
        a file is not safetensors (a pickled ``.bin`` has no byte layout to read it by)."""
        self.reads = {key: merge(ranges) for key, ranges in rows.items()}
        self._spans = self.byte_ranges(rows)
        self._held_checked = False
        return self._spans

    def byte_ranges(self, rows: Rows) -> Spans | None:
        """Where the given stored rows of each tensor lie: byte ranges [start, stop) per weight file, sorted
        and merged where they touch. None when a file is not safetensors (a pickled ``.bin`` has no
        byte layout to read it by)."""
        out: Spans = {}
        for key, ranges in rows.items():
            file = self._file_of(key)
            header = self._header(file)  # parsed once per checkpoint, checked sound
            if header is None:
                return None
            start = self._data_starts[file]
            out.setdefault(file, []).extend((start + a, start + b) for a, b in row_bytes(header[key], ranges))
        return {file: merge(spans) for file, spans in out.items()}

    def require_rows(self, rows: Rows) -> None:
        """Raise unless the given stored rows of each tensor are here: always so for whole files; a partial
        download holds only the rows it was fetched for. Rows within the read plan are checked by its byte ranges,
        once."""
        if self.fetched is None:
            return
        if self.reads is not None and self._spans is not None and self._planned(rows):
            if not self._held_checked:
                self._check_held(self._spans, self.reads)
                self._held_checked = True
            return
        self._check_held(self.byte_ranges(rows) or {}, rows)

    def _planned(self, rows: Rows) -> bool:
        """Whether every row given is one the read plan reads."""
        reads = self.reads or {}
        return all(key in reads and not missing(ranges, reads[key]) for key, ranges in rows.items())

    def _check_held(self, where: Spans, rows: Rows) -> None:
        for file, spans in where.items():
            held = (self.fetched or {}).get(file, [])
            for a, b in spans:
                if not any(h0 <= a and b <= h1 for h0, h1 in held):
                    key = next((k for k in rows if self._file_of(k) == file), next(iter(rows)))  # a part elsewhere
                    raise CheckpointError(
                        self.name,
                        f"only some rows of {file.name} were fetched (bytes {a:,}-{b:,} of tensor {shown(key)} "
                        "are not): embed it again to fetch what this representation reads",
                    )

    def prefetch(self) -> None:
        """Ask the kernel to read the weight files (or only the byte ranges of the read plan, where there is one)
        into the page cache now, without waiting for it.

        Called for models queued behind the one being computed, so their reads from disk overlap
        the computation; a no-op for files already cached, and where the OS lacks the call.
        """
        advise = getattr(os, "posix_fadvise", None)
        if advise is None:
            return
        ranges = self._spans
        for file in self.files:
            fd = os.open(file, os.O_RDONLY)
            try:
                for a, b in ranges.get(file, []) if ranges is not None else [(0, 0)]:
                    advise(fd, a, b - a, os.POSIX_FADV_WILLNEED)
            finally:
                os.close(fd)
