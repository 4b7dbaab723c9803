"""The base's probe inputs (``Representation.probe``), kept beside the store: computed once per base and probe.

One kept file per base and probe length, ``<store>.products/<id>.probe.kept`` (:mod:`~modelvec.store.kept`: a
header with what it was computed for, each row checksummed). It is used only where everything verifies and it was
computed for this base's version, this probe text and this many tokens by this computation
(:data:`~modelvec.represent.probe.PROBE_VERSION`); otherwise it is computed again and replaces it (the file is this
store's own: its name is made from the store's).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from ..represent.probe import PROBE_VERSION, ProbeInputs, probe_checksum
from .kept import read_kept, write_kept

KIND = "modelvec probe inputs"


def inputs_path(store: str | Path, base: str, tokens: int) -> Path:
    """Where a store keeps ``base``'s inputs on ``tokens`` probe tokens."""
    store = Path(store)
    digest = hashlib.sha1(f"{base}\0{tokens}".encode()).hexdigest()[:16]
    return store.parent / f"{store.name}.products" / f"{digest}.probe.kept"


def inputs_meta(base: str, version: str, tokens: int) -> dict[str, Any]:
    """What a kept file of inputs must have been computed for."""
    return {"kind": KIND, "base": base, "base_version": version, "tokens": tokens, "text": probe_checksum(),
            "computation": PROBE_VERSION}  # fmt: skip


def read_inputs(path: Path, meta: dict[str, Any]) -> tuple[ProbeInputs | None, str | None]:
    """The kept inputs at ``path`` where they verify and were computed for ``meta``; else None and why (None: there
    was no file)."""
    kept = read_kept(path)
    if kept is None:
        return None, None
    if kept.problem is not None:
        return None, kept.problem
    if {k: kept.meta.get(k) for k in meta} != meta:
        changed = ", ".join(k for k in meta if kept.meta.get(k) != meta[k])
        return None, f"computed for another {changed}"
    if damaged := [name for name, rows in kept.damaged.items() if len(rows)]:
        return None, f"{len(damaged)} arrays do not match their checksums"
    of = kept.meta.get("of")
    if not isinstance(of, dict) or not set(of.values()) <= set(kept.arrays):
        return None, "its table of matrices is not readable"
    return ProbeInputs(int(meta["tokens"]), dict(kept.arrays), {str(k): str(v) for k, v in of.items()}), None


def write_inputs(path: Path, meta: dict[str, Any], inputs: ProbeInputs) -> bool:
    """Keep ``inputs`` at ``path`` (False where it could not be written: computed again next time)."""
    return write_kept(path, {**meta, "of": inputs.of}, inputs.arrays)
