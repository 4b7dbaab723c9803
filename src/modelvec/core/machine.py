"""What the machine lends this process: its cores."""

from __future__ import annotations

import os


def cores() -> int:
    """The cores this process may run on (its affinity, as a container or ``taskset`` limits it), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)
