"""The versions of a store's bases: which version each stored vector was embedded against, the base as it is now
(recorded with its files' stamp as a run embeds against it), and the vectors left stale by a base that changed."""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import datetime

import pandas as pd

from ..core.names import is_hub_id
from ..represent.representation import Representation
from .connection import Connection
from .formats.schema import BASE_VERSIONS, first_row, transaction
from .reads import Reads


class Versions:
    """The versions of the bases a :class:`~modelvec.store.Store` holds vectors of (``store.versions``)."""

    def __init__(self, db: Connection, reads: Reads) -> None:
        self._db, self._reads = db, reads

    def stored(self, base: str, representation: Representation | str | None = None) -> pd.DataFrame:
        """The versions of ``base`` its stored vectors (under ``representation``; None: any) were computed against:
        ``base_hash``, ``vectors`` (how many) and ``newest`` (when the last of them was stored), by ``base_hash``."""
        where, args = self._db.where(base, representation, None)
        return self._db.con.execute(
            f"SELECT base_hash, count(*) AS vectors, max(created_at) AS newest FROM vectors {where} "
            "GROUP BY base_hash ORDER BY base_hash",
            args,
        ).df()

    def base_hashes(self, base: str, representation: Representation) -> list[str]:
        """The versions of the base weights the stored vectors of ``base`` were computed against."""
        return list(self.stored(base, representation)["base_hash"])

    def model_versions(self, model: str, base: str, representation: Representation) -> list[str]:
        """The versions of ``base`` (``base_hash``) that ``model`` has vectors embedded against under
        ``representation``."""
        rows = self._db.con.execute(
            "SELECT base_hash FROM vectors WHERE model = ? AND base = ? AND params = ? ORDER BY base_hash",
            [model, base, representation.key()],
        ).fetchall()
        return [str(r[0]) for r in rows]

    def record_base(self, base: str, stamp: str, base_version: str) -> None:
        """Record that vectors of ``base`` are embedded against ``base_version`` while its files' stamp is ``stamp``
        (a Hub base: both its ``git:<sha>``): how a report knows the base's version without hashing it. Nothing is
        written where that is already what the store says (the last recorded, with these files). The stamp is stored
        in the column ``identity``."""
        if self.recorded_base(base, stamp) == base_version and self.recorded_base(base) == base_version:
            return
        with transaction(self._db.con):
            self._db.con.execute(
                BASE_VERSIONS.insert(("base", "identity", "base_hash", "recorded_at")),
                [base, stamp, base_version, datetime.now()],
            )

    def recorded_base(self, base: str, stamp: str | None = None) -> str | None:
        """The version of ``base`` recorded for files of ``stamp`` (None: the one recorded last), else None."""
        if "base_versions" not in self._db.tables():
            return None
        where, args = self._db.clauses(base=base, identity=stamp)
        row = first_row(
            self._db.con, f"SELECT base_hash FROM base_versions {where} ORDER BY recorded_at DESC LIMIT 1", args
        )
        return str(row[0]) if row else None

    def stamps(self, base: str, base_hash: str) -> list[str]:
        """The stamps of ``base``'s files recorded for its version ``base_hash``."""
        if "base_versions" not in self._db.tables():
            return []
        rows = self._db.con.execute(
            "SELECT identity FROM base_versions WHERE base = ? AND base_hash = ? ORDER BY recorded_at",
            [base, base_hash],
        ).fetchall()
        return [str(r[0]) for r in rows]

    def base_now(self, base: str) -> str | None:
        """The version (``base_hash``) of ``base`` as it is now: a local base's from its files' stamp (names,
        sizes, times and headers) as the run that embedded against it recorded it, else its content hashed; a Hub
        base's commit at its last discovery (or the version recorded with it, where that commit's weights are an
        earlier one's), else the one embedded against last; None where nothing says (a local
        base gone from this machine, stored by a version that did not record it)."""
        sha = self._reads.base_sha(base) if is_hub_id(base) else None
        return version_now(base, sha, lambda stamp: self.recorded_base(base, stamp))

    def stale(self) -> pd.DataFrame:
        """The stored vectors embedded against another version of their base than the one it is now (:meth:`base_now`),
        where vectors of the version it is now are stored: (base, base_hash, vectors), one row per base and version.
        A base whose version now has no vectors (changed since, nothing embedded again yet) has none: nothing
        says which of its versions the next run will keep."""
        out = []
        for base in self._db.con.execute("SELECT DISTINCT base FROM vectors ORDER BY base").fetchall():
            versions = self.stored(base[0])
            now = self.base_now(base[0]) if len(versions) > 1 else None
            if now is not None and now in set(versions["base_hash"]):
                out += [(base[0], v.base_hash, int(v.vectors)) for v in versions.itertuples() if v.base_hash != now]
        return pd.DataFrame(out, columns=["base", "base_hash", "vectors"])


def version_now(base: str, sha: str | None, recorded: Callable[[str | None], str | None]) -> str | None:
    """The version of ``base`` as it is now (:meth:`Versions.base_now`), given a Hub base's commit at its last
    discovery (``sha``) and ``recorded(stamp)``, the version recorded for files of ``stamp`` (None: the one recorded
    last): the one rule, whether the store is asked or a snapshot of it (:mod:`~modelvec.store.views.snapshot`)."""
    if is_hub_id(base):  # a commit recorded with the weights of an earlier one keeps that one's version
        return (recorded(f"git:{sha}") or f"git:{sha}") if sha else recorded(None)
    if not os.path.exists(base):
        return recorded(None)
    from ..read import Checkpoint

    files = Checkpoint(base, name=base)
    return recorded(files.stamp()) or files.fingerprint()
