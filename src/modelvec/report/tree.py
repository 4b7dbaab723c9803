"""The model tree of a stored base: what the weights say each model is (:mod:`modelvec.analyse.tree`) beside what
its card declares (the Hub catalogue's relation and parents, or a local folder's README), from the stored traces."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from ..analyse.tree import Tree, TreeRule, infer_tree
from ..core.errors import NothingStoredError
from ..core.names import model_id
from ..hub.cards import read_card
from ..represent.representation import Representation
from ..store import Store, opened
from .stored import stored_base


def model_tree(
    base: str | os.PathLike[str],
    *,
    representation: Representation | None = None,
    store: Store | str | os.PathLike[str] | None = None,
    rule: TreeRule | None = None,
    only: Sequence[str] | None = None,
) -> Tree:
    """The inferred tree of every model stored for ``base`` (or of ``only`` those), each with what it declares.

    The base is named as given in the tree (a parent ``base`` means the base itself)."""
    representation = representation or Representation()
    with opened(store, read_only=True) as db:
        stored = stored_base(db, base, representation)
        stored_traces = db.traces(stored, representation.key())
        if stored_traces.empty:
            raise NothingStoredError(
                stored,
                f"no traces stored with representation {representation.key()} (vectors stored before traces were "
                "kept, or not the sketch): embed them again with --force",
            )
        meta = db.metadata(base=stored, representation=representation)
        catalogue = db.catalogue(base=stored)
    traces = stored_traces.frame
    adapters = set(meta.loc[meta["adapter"].fillna(False).astype(bool), "model"])
    embedded_on = {
        m: (p if isinstance(p, str) else None) for m, p in zip(traces["model"], traces["parent"]) if m in adapters
    }
    sources = dict(zip(meta["model"], meta["source"]))
    declared = _declared(list(traces["model"]), sources, catalogue)
    levels = [None if lv != lv else float(lv) for lv in traces["levels"]]
    return infer_tree(
        str(base),
        list(traces["model"]),
        stored_traces.sketches,
        float(traces["scale"].iloc[0]),
        levels,
        adapters=embedded_on,
        declared=declared,
        base_names=[stored, model_id(base), "base"],
        rule=rule,
        only=only,
    )


def _declared(
    models: list[str], sources: dict[str, str], catalogue: pd.DataFrame
) -> dict[str, tuple[str | None, list[str]]]:
    """What each model's card declares: the Hub catalogue's relation and parents, else a local folder's README
    (``base_model``, ``base_model_relation``), its parents named as the stored models they name."""
    by_folder = {Path(m).name: m for m in models if os.path.isdir(m)}
    out: dict[str, tuple[str | None, list[str]]] = {}
    hub: dict[str, Any] = {r.model: r for r in catalogue.itertuples()} if not catalogue.empty else {}
    for m in models:
        if m in hub and hub[m].relation is not None:
            parents = hub[m].parents
            out[m] = (hub[m].relation, list(parents) if parents is not None else [])
            continue
        folder = sources.get(m, m)
        card = read_card(folder) if os.path.isdir(folder) else {}
        said = card.get("base_model")
        if not said:
            continue
        parents = [said] if isinstance(said, str) else [str(p) for p in said]
        relation = card.get("base_model_relation")
        out[m] = (
            str(relation) if relation else ("merge" if len(parents) > 1 else "finetune"),
            [by_folder.get(p, p) for p in parents],
        )
    return out
