"""Byte ranges ``[start, stop)``: merged, and what is missing from what is held (the reader and the fetcher share them)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def merge(spans: Iterable[Sequence[int]], gap: int = 0) -> list[tuple[int, int]]:
    """Ranges sorted, empty ones dropped, and merged where they overlap or at most ``gap`` bytes lie between them."""
    merged: list[list[int]] = []
    for start, stop in sorted((int(a), int(b)) for a, b in spans):
        if stop <= start:
            continue
        if merged and start - merged[-1][1] <= gap:
            merged[-1][1] = max(merged[-1][1], stop)
        else:
            merged.append([start, stop])
    return [(a, b) for a, b in merged]


def missing(wanted: Iterable[Sequence[int]], held: Iterable[Sequence[int]]) -> list[tuple[int, int]]:
    """The parts of ``wanted`` that ``held`` does not cover, merged."""
    have = merge(held)
    out: list[tuple[int, int]] = []
    for start, stop in merge(wanted):
        at = start
        for a, b in have:
            if b <= at or a >= stop:
                continue
            if a > at:
                out.append((at, a))
            at = max(at, b)
        if at < stop:
            out.append((at, stop))
    return out
