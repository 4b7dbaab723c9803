"""What is stored, as ``modelvec show`` prints it: each vector with what the reports make of it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ...core.errors import NothingStoredError
from ...represent.representation import Representation
from ..store import Store
from .population import Population


@dataclass
class StoreOverview:
    """What ``modelvec show`` prints: counts per base and representation, the models, the failures."""

    path: str
    summary: pd.DataFrame
    models: pd.DataFrame  # one row per vector; ``state``: what the reports make of it (a copy, stale...) or None
    failures: pd.DataFrame
    stale: pd.DataFrame = field(default_factory=pd.DataFrame)  # :meth:`~modelvec.store.versions.Versions.stale`

    def as_json(self) -> dict[str, Any]:
        def records(frame: pd.DataFrame) -> list[dict[str, Any]]:
            return json.loads(frame.to_json(orient="records", date_format="iso"))

        return {
            "store": self.path,
            "summary": records(self.summary),
            "models": records(self.models),
            "failures": records(self.failures),
            "stale": records(self.stale),
        }


def overview(db: Store) -> StoreOverview:
    """What is stored (``modelvec show``): vectors per base and representation, one row per vector with its ``state``
    as every report sees it, through each base's :class:`Population` (stale: embedded against an earlier version of
    its base; a copy of the base or of another model, a re-save, a quantization), the failures, and the stale
    vectors per base."""
    models = db.reads.metadata()
    versions = [
        r[0] for r in db.con.execute("SELECT base_hash FROM vectors ORDER BY model, base, params, base_hash").fetchall()
    ]
    states: list[str | None] = [None] * len(models)
    originals: list[str | None] = [None] * len(models)  # a copy's original (its stored name), for a display
    for row in db.reads.summary().drop_duplicates(["base", "params"]).itertuples():
        try:
            pop = Population(db, row.base, Representation.from_stored(json.loads(row.params_json)))
        except (NothingStoredError, TypeError, ValueError):  # a base changed since (nothing current), another version
            continue
        for i in np.flatnonzero((models["base"] == row.base) & (models["params"] == row.params)):
            model = str(models["model"].iloc[i])
            states[i] = "stale" if versions[i] != pop.base_hash else pop.state(model)
            copied = pop.copies.get(model) if states[i] != "stale" else None
            originals[i] = copied.original if copied is not None else None
    found = models.assign(state=states, copy_of=originals)
    return StoreOverview(str(db.path), db.reads.summary(), found, db.reads.failures(), db.versions.stale())
