"""The base's probe inputs (``Representation.probe``), kept beside the store: computed once per base and probe.

One kept file per base and probe length, ``<store>.products/<id>.probe.kept`` (named by the store's
:class:`~modelvec.store.derived.cache.CacheFolder`; :mod:`~modelvec.store.formats.cachefile`: a header with what it was
computed for, each row checksummed). It is used only where everything verifies and it was computed for this base's
version, this probe text and this many tokens by this computation (:data:`~modelvec.represent.probe.PROBE_VERSION`);
otherwise it is computed again and replaces it (the file is this store's own: its name is made from the store's). What
is stale is the kept folder's to say (:meth:`~modelvec.store.derived.cache.CacheFolder.current`); this module says what
the inputs must have been computed for and how they are laid out.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...represent.probe import PROBE_VERSION, ProbeInputs, probe_checksum
from ..formats.cachefile import write_cache_file
from .cache import CacheFolder

KIND = "modelvec probe inputs"


def inputs_path(store: str | Path, base: str, tokens: int) -> Path:
    """Where a store keeps ``base``'s inputs on ``tokens`` probe tokens (its kept folder names it)."""
    return CacheFolder(Path(store)).inputs_path(base, tokens)


def inputs_meta(base: str, version: str, tokens: int) -> dict[str, Any]:
    """What a kept file of inputs must have been computed for."""
    return {"kind": KIND, "base": base, "base_version": version, "tokens": tokens, "text": probe_checksum(),
            "computation": PROBE_VERSION}  # fmt: skip


def read_inputs(path: Path, meta: dict[str, Any]) -> tuple[ProbeInputs | None, str | None]:
    """The kept inputs at ``path`` where they verify and were computed for ``meta``; else None and why (None: there
    was no file)."""
    kept, why = CacheFolder.current(path, meta)  # what is stale: the kept folder's rule for each of its files
    if kept is None:
        return None, why
    of = kept.meta.get("of")
    if not isinstance(of, dict) or not set(of.values()) <= set(kept.arrays):
        return None, "its table of matrices is not readable"
    return ProbeInputs(int(meta["tokens"]), dict(kept.arrays), {str(k): str(v) for k, v in of.items()}), None


def write_inputs(path: Path, meta: dict[str, Any], inputs: ProbeInputs) -> bool:
    """Keep ``inputs`` at ``path`` (False where it could not be written: computed again next time)."""
    return write_cache_file(path, {**meta, "of": inputs.of}, inputs.arrays)
