"""The local Hub's bandwidth limit: a bandwidth read from ``1gbit``, ``50MB`` and the like
(:func:`parse_bandwidth`), and the token bucket that every connection's writes share, as one link would."""

from __future__ import annotations

import re
import threading
import time

PACE_CHUNK = 64 << 10  # bytes per write (and the token bucket's burst) when a bandwidth is set
_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}


class _TokenBucket:
    """One link's bandwidth, shared by every connection: a sender takes tokens (bytes) before writing and sleeps
    off any debt, so N parallel answers share ``rate`` between them. Holds at most ``burst`` bytes of credit."""

    def __init__(self, rate: float, burst: int = PACE_CHUNK) -> None:
        if not rate > 0:
            raise ValueError(f"bandwidth must be positive, got {rate!r}")
        self.rate = float(rate)
        self.burst = float(burst)
        self._tokens = float(burst)
        self._stamp = time.monotonic()
        self._lock = threading.Lock()

    def take(self, n: int) -> None:
        """Block until ``n`` more bytes may go out on the link."""
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate) - n
            self._stamp = now
            wait = -self._tokens / self.rate
        if wait > 0:
            time.sleep(wait)


def parse_bandwidth(text: str | float) -> float:
    """Bytes per second from ``1gbit``, ``100mbit``, ``50MB``, ``20MiB/s``, ``8e6`` (a bare number is bytes/s).

    Prefixes k, M, G, T are decimal (any case), Ki, Mi, Gi, Ti binary; ``bit``/``bits``/``bps`` or a lowercase
    ``b`` are bits, ``B`` (or no unit) bytes; an optional ``/s`` ends it."""
    if isinstance(text, (int, float)):
        rate = float(text)
    else:
        m = re.fullmatch(
            r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMgGtT]i?)?(bits?|bps|b|B)?(?:/s)?\s*", str(text)
        )
        if not m:
            raise ValueError(f"not a bandwidth: {text!r} (e.g. 1gbit, 100mbit, 50MB, or bytes per second)")
        number, prefix, unit = m.groups()
        rate = float(number) * _UNITS[(prefix or "").lower()]
        if unit is not None and unit != "B":
            rate /= 8
    if not rate > 0 or rate == float("inf"):
        raise ValueError(f"bandwidth must be a positive number of bytes per second, got {text!r}")
    return rate
