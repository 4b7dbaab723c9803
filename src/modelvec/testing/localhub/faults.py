"""Fault injection for the local Hub: the rules that :meth:`LocalHub.fail`, :meth:`LocalHub.truncate` and
:meth:`LocalHub.delete` arm (:class:`Faults`), and the :class:`Fault` a request draws, which the HTTP handler
consults at each step of its answer (whether to answer at all, which headers, how much of the body, how).

What each kind does is told by :meth:`LocalHub.fail`.
"""

from __future__ import annotations

import fnmatch
import random
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

KINDS = {  # kind -> the methods it takes by default
    "status": ("GET", "HEAD"),
    "reset": ("GET",),
    "short": ("GET",),
    "slow": ("GET", "HEAD"),
    "size": ("HEAD",),
    "etag": ("GET", "HEAD"),
    "commit": ("GET", "HEAD"),
    "corrupt": ("GET",),
    "ignore-range": ("GET",),
    "wrong-range": ("GET",),
    "bad-content-range": ("GET",),
}
_RANGE_KINDS = {"ignore-range", "wrong-range", "bad-content-range"}  # taken by GETs with a Range header only
_BODY_KINDS = ("reset", "short", "slow", "corrupt")  # kinds that act on the bytes of a body
_HEADER_OF = {"etag": "ETag", "commit": "X-Repo-Commit"}  # kinds that replace a header's value


@dataclass(frozen=True)
class Fault:
    """The fault one request drew, or :data:`NO_FAULT` (``kind`` None): each method says what it does to one step
    of the answer, and answers as if there were no fault when its kind does not act on that step."""

    kind: str | None = None
    status: int = 0  # the status a ``status`` fault answers
    retry_after: float | None = None
    after_bytes: int = 0
    delay: float = 0.0
    value: Any = None

    def error(self) -> tuple[int, dict, dict] | None:
        """``status``: the status, JSON body and headers of the answer that replaces the Hub's; else None."""
        if self.kind != "status":
            return None
        headers = {}
        if self.retry_after is not None:
            ra = self.retry_after
            headers["Retry-After"] = str(int(ra)) if float(ra).is_integer() else str(ra)
        return self.status, {"error": f"injected failure {self.status}"}, headers

    @property
    def before_answer(self) -> str | None:
        """``reset`` or ``slow`` when the fault strikes before any answer (``after_bytes=0``), else None."""
        return self.kind if self.kind in ("reset", "slow") and self.after_bytes == 0 else None

    def closes(self, method: str) -> bool:
        """Whether a JSON answer to ``method`` ends its connection: its body is to be cut (``reset``, ``short``)."""
        return self.kind in ("reset", "short") and method != "HEAD"

    def headers(self, headers: dict) -> dict:
        """``headers`` with the ``ETag`` (``etag``) or ``X-Repo-Commit`` (``commit``) they carry set to ``value``."""
        name = _HEADER_OF.get(self.kind or "")
        return {**headers, name: self.value} if name in headers else headers

    @property
    def ignores_range(self) -> bool:
        """``ignore-range``: the ``Range`` header is not looked at."""
        return self.kind == "ignore-range"

    def keep(self, keep: int | None) -> int | None:
        """How many body bytes go out before the connection closes, given a :meth:`LocalHub.truncate` rule's
        ``keep`` (None: all of them): ``short`` cuts after ``after_bytes`` if that is sooner."""
        if self.kind == "short" and (keep is None or self.after_bytes < keep):
            return self.after_bytes
        return keep

    def announced(self, method: str, length: int) -> int:
        """The ``Content-Length`` announced for ``length`` bytes: ``size`` adds ``value`` to it on a HEAD."""
        return max(0, length + self.value) if self.kind == "size" and method == "HEAD" else length

    def source(self, start: int, length: int, size: int) -> int:
        """Where in a file of ``size`` bytes the 206 body for ``length`` bytes from ``start`` comes from:
        ``wrong-range`` shifts it by ``value`` (kept inside the file)."""
        return min(max(0, start + self.value), size - length) if self.kind == "wrong-range" else start

    def content_range(self, start: int, end: int, size: int) -> str:
        """The ``Content-Range`` of a 206 answer: ``bad-content-range`` shifts the range it names by ``value``."""
        shift = self.value if self.kind == "bad-content-range" else 0
        return f"bytes {start + shift}-{end + shift}/{size}"

    def body(self, chunks: Iterable[bytes], offset: int = 0) -> Iterator[bytes | str]:
        """The pieces of a body whose first byte is byte ``offset`` of the file: ``corrupt`` inverts the byte at
        file offset ``after_bytes``; ``reset``, ``short`` and ``slow`` yield their kind (a str) where the body's
        first ``after_bytes`` bytes end: the sender resets, closes or stalls there, and after reset and short the
        body ends."""
        kind = self.kind if self.kind in _BODY_KINDS else None
        at = self.after_bytes if kind else -1
        sent = 0
        for chunk in chunks:
            if kind == "corrupt" and offset + sent <= at < offset + sent + len(chunk):
                i = at - offset - sent
                chunk = chunk[:i] + bytes([chunk[i] ^ 0xFF]) + chunk[i + 1 :]
            if kind in ("reset", "short", "slow") and sent <= at < sent + len(chunk) and at > 0:
                head = at - sent
                yield chunk[:head]
                sent += head
                chunk = chunk[head:]
                yield kind
                if kind != "slow":
                    return
                kind = None
            yield chunk
            sent += len(chunk)


NO_FAULT = Fault()


class Faults:
    """The fault rules armed on one hub, tried in the order given, and the deletions waiting for their requests.

    Works under the hub's lock (``lock``, re-entrant): the hub holds it across :meth:`due` and the deletions it
    makes, so a request is counted and the repositories it was waiting for are gone in one step."""

    def __init__(self, lock: threading.RLock) -> None:
        self._lock = lock
        self._rules: list[dict] = []
        self._truncations: list[dict] = []
        self._deletions: list[dict] = []  # repos to delete once so many more requests have come in

    def add(
        self,
        pattern: str,
        *,
        kind: str,
        status: int | None,
        times: int | None,
        methods: Iterable[str] | None,
        retry_after: float | None,
        after_bytes: int,
        delay: float,
        value: Any,
        rate: float | None,
        seed: int | None,
    ) -> None:
        """Arm a rule of :meth:`LocalHub.fail` (which says what the arguments mean), after the rules already armed."""
        if kind not in KINDS:
            raise ValueError(f"unknown fault kind {kind!r}; known: {sorted(KINDS)}")
        if kind == "status" and status is None:
            raise ValueError("kind='status' needs a status")
        if kind in ("etag", "commit") and not isinstance(value, str):
            raise ValueError(f"kind={kind!r} needs value= (the header's value)")
        if rate is not None and not 0.0 < float(rate) <= 1.0:
            raise ValueError(f"rate must be a probability in (0, 1], not {rate!r}")
        if methods is None:
            methods = ("GET",) if kind == "slow" and after_bytes > 0 else KINDS[kind]
        with self._lock:
            self._rules.append(
                {
                    "pattern": pattern,
                    "kind": kind,
                    "status": None if status is None else int(status),
                    "left": None if times is None else int(times),
                    "methods": {m.upper() for m in methods},
                    "retry_after": retry_after,
                    "after_bytes": max(0, int(after_bytes)),
                    "delay": float(delay),
                    "value": (1 if value is None else int(value))
                    if kind in ("size", "wrong-range", "bad-content-range")
                    else value,
                    "rate": None if rate is None else float(rate),
                    "rng": None if rate is None else random.Random(seed),
                }
            )

    def take(self, method: str, path: str, ranged: bool = False) -> Fault:
        """The fault of the first rule that matches a request (``ranged``: it has a ``Range`` header), counted as
        taken; :data:`NO_FAULT` when none does."""
        with self._lock:
            for rule in self._rules:
                if (
                    (rule["left"] is None or rule["left"] > 0)
                    and method in rule["methods"]
                    and (ranged or rule["kind"] not in _RANGE_KINDS)
                    and fnmatch.fnmatchcase(path, rule["pattern"])
                    and (rule["rate"] is None or rule["rng"].random() < rule["rate"])
                ):
                    if rule["left"] is not None:
                        rule["left"] -= 1
                    return Fault(
                        kind=rule["kind"],
                        status=rule["status"] or 0,
                        retry_after=rule["retry_after"],
                        after_bytes=rule["after_bytes"],
                        delay=rule["delay"],
                        value=rule["value"],
                    )
            return NO_FAULT

    def truncate(self, pattern: str, keep: int, times: int | None) -> None:
        """Arm a rule of :meth:`LocalHub.truncate`."""
        with self._lock:
            self._truncations.append({"pattern": pattern, "keep": int(keep), "left": times})

    def take_truncation(self, path: str) -> int | None:
        """The ``keep`` of the first truncation that matches a GET of ``path``, counted as taken; None when none does."""
        with self._lock:
            for rule in self._truncations:
                if (rule["left"] is None or rule["left"] > 0) and fnmatch.fnmatchcase(path, rule["pattern"]):
                    if rule["left"] is not None:
                        rule["left"] -= 1
                    return rule["keep"]
            return None

    def delete_after(self, repo_id: str, after: int, pattern: str) -> None:
        """Arm a deferred deletion of :meth:`LocalHub.delete`: ``repo_id`` goes at the ``after``-th request to come
        whose path matches ``pattern``."""
        with self._lock:
            self._deletions.append({"repo": repo_id, "pattern": pattern, "left": int(after)})

    def due(self, path: str) -> list[str]:
        """A request for ``path`` came in: the deletions waiting for it count it; the repositories whose count is
        reached, to delete now (their rules are dropped)."""
        with self._lock:
            if not self._deletions:
                return []
            due = []
            for rule in list(self._deletions):
                if fnmatch.fnmatchcase(path, rule["pattern"]):
                    rule["left"] -= 1
                    if rule["left"] <= 0:
                        self._deletions.remove(rule)
                        due.append(rule["repo"])
            return due

    def clear(self) -> None:
        """Drop every rule and every deletion still waiting."""
        with self._lock:
            self._rules.clear()
            self._truncations.clear()
            self._deletions.clear()
