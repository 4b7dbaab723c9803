"""The model tree of a stored base: what the weights say each model is (:mod:`modelvec.analyse.tree`) beside what
its card declares (the Hub catalogue's relation and parents, or a local folder's README), from the stored traces of
the base's :class:`~modelvec.store.Population`."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..analyse.tree import Node, Tree
from ..analyse.tree.lineage import infer_tree
from ..analyse.tree.rule import TreeRule
from ..core.errors import NothingStoredError
from ..core.names import model_id
from ..represent.representation import Representation
from ..store import Population, Store, opened
from ..store.reads import StoredTraces

#: The row statistics of a trace the tree reads (:class:`~modelvec.represent.trace.Trace`).
STATISTICS = ("zeros", "zeros_bf16", "along", "precision", "rounding")
#: Why a model of the population has no trace, and what to do: stored before traces were kept.
NO_TRACE = "no trace stored (embedded before modelvec kept traces): embed it again with --force to place it"


@dataclass
class TreeReport(Tree):
    """The tree as a report answers it: the inferred :class:`~modelvec.analyse.tree.Tree` and what its population
    could not give it. ``damaged``: stored traces whose bytes did not verify (model -> one line; their models are
    ``untraced`` nodes), ``notes``: what the tree's population left out and why, ``repaired``: kept files that did
    not verify and were computed again, one line each (said on stderr, not in the answer)."""

    damaged: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    repaired: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {**super().as_json(), "damaged": dict(self.damaged), "notes": list(self.notes)}


def model_tree(
    base: str | os.PathLike[str],
    *,
    representation: Representation | None = None,
    store: Store | str | os.PathLike[str] | None = None,
    rule: TreeRule | None = None,
    only: Sequence[str] | None = None,
) -> TreeReport:
    """The inferred tree of every model stored for ``base`` (or of ``only`` those), each with what it declares.

    The base is named as given in the tree (a parent ``base`` means the base itself). Its models are those embedded
    against the base as it is now; one without a trace is an ``untraced`` node with the reason and the remedy
    (``tree.partial``); a trace whose bytes are damaged is ``tree.damaged``."""
    with opened(store, read_only=True) as db:
        return tree_of(Population(db, base, representation), rule=rule, only=only, name=str(base))


def tree_of(
    pop: Population,
    *,
    rule: TreeRule | None = None,
    only: Sequence[str] | None = None,
    name: str | None = None,
    verify: bool = True,
) -> TreeReport:
    """The tree of a population's models (its store open), named ``name`` (default: the base as stored).

    The whole tree is kept beside the store for what it was inferred from (every trace's checksum and row
    statistics, the cards, the rule): a later call reads it instead of inferring it again. ``verify`` (the
    default): every trace is read and checked first, as ``cluster`` reads every vector (a damaged one makes its
    model untraced, so the tree is inferred again); ``verify=False`` (a neighbour query) trusts the kept tree where
    the traces' rows name it, and reads the traces only to infer it."""
    rule = rule or TreeRule()
    stored, inputs, kept = _kept(pop, rule, only, name, read=verify)
    if kept is None and not verify:  # no tree kept for the traces' rows: read and check every trace, as verify does
        stored, inputs, kept = _kept(pop, rule, only, name, read=True)
    if kept is not None:
        tree = Tree.from_json(kept)
    else:
        tree = inputs.infer(pop, stored, only)
        for node in tree.nodes:
            node.quantized = inputs.quantized.get(node.model)
        tree.nodes += [n for n in inputs.not_read() if only is None or n.model in only]
        if only is None:
            pop.keep_tree(inputs.key, tree.as_json())
    return TreeReport(
        tree.base,
        tree.nodes,
        damaged=dict(stored.damaged),
        notes=pop.left_out(off_map=False),
        repaired=list(pop.repaired),
    )


def _kept(
    pop: Population, rule: TreeRule, only: Sequence[str] | None, name: str | None, *, read: bool
) -> tuple[StoredTraces, _Inputs, dict[str, Any] | None]:
    """The population's traces (``read``: each read and checked), what its tree is inferred from, and the tree
    kept beside the store for exactly that (None: none kept, or ``only`` some models asked for)."""
    stored = pop.traces(read=read)
    if stored.frame.empty:
        raise NothingStoredError(
            pop.name,
            f"no traces stored with representation {pop.representation.key()} (vectors stored before traces were "
            "kept, or not the sketch): embed them again with --force",
        )
    inputs = _Inputs(pop, stored, rule, name)
    return stored, inputs, pop.kept_tree(inputs.key) if only is None else None


class _Inputs:
    """What a population's tree is inferred from, besides the sketches: each trace's row, the untraced models and
    why, the adapters and what they were embedded on, the cards; and ``key``, a digest of all of it (and the
    traces' checksums, the rule and the base's names): the kept tree holds for exactly that."""

    def __init__(self, pop: Population, stored: StoredTraces, rule: TreeRule, name: str | None) -> None:
        traces, meta = stored.frame, pop.models
        traced = set(traces["model"])
        self.untraced = {
            m: stored.damaged[m].removeprefix(f"{m}: ") if m in stored.damaged else NO_TRACE
            for m in meta["model"]
            if m not in traced
        }
        adapters = set(meta.loc[meta["adapter"].fillna(False).astype(bool), "model"])
        #: the quantizations read, with the types their weights were read in (one node a repository: its finest file)
        self.quantized = dict(
            zip(meta.loc[meta["quantized"].notna(), "model"], meta.loc[meta["quantized"].notna(), "quantized"])
        )
        self.embedded_on = {
            m: (p if isinstance(p, str) else None) for m, p in zip(traces["model"], traces["parent"]) if m in adapters
        }
        catalogue = pop.catalogue()
        self.declared = pop.declared()
        self.unread = (
            catalogue[(catalogue["relation"] == "quantized") & ~catalogue["model"].isin(set(meta["model"]))]
            if not catalogue.empty
            else catalogue
        )
        if not self.unread.empty:  # a quantization that was read and failed: why, in its error's words
            failed = pop.db.reads.failures()
            errors = dict(zip(failed["model"], failed["error"])) if not failed.empty else {}
            self.unread = self.unread.assign(
                reason=[errors.get(m, r) for m, r in zip(self.unread["model"], self.unread["reason"])]
            )
        self.base = name if name is not None else pop.name
        self.names = list(dict.fromkeys([*pop.names_in_cards(), model_id(self.base), "base"]))
        #: the population's copies (its one rule), the base named as the tree names it
        self.copies = {
            m: replace(c, original=self.base) if c.original == pop.name else c for m, c in pop.copies.items()
        }
        self.rule = rule
        rows = traces[["model", "sketch_hash", "levels", "scale", *STATISTICS, "parent", "entries_hash"]].astype(str)
        said = [
            self.base,
            self.names,
            repr(rule),
            rows.values.tolist(),
            sorted(self.untraced.items()),
            sorted((m, list(d)) for m, d in self.declared.items()),
            sorted(self.embedded_on.items(), key=str),
            sorted(self.quantized.items()),
            sorted((m, c.original, c.exact, c.chosen_by) for m, c in self.copies.items()),
            self.unread[["model", "reason"]].astype(str).values.tolist() if not self.unread.empty else [],
        ]
        self.key = hashlib.sha1(json.dumps(said, default=str).encode()).hexdigest()

    def not_read(self) -> list[Node]:
        """The quantizations the catalogue records and nobody read (a format not read, an EXL2's; a GGUF, GPTQ, AWQ or
        bitsandbytes one whose bytes could not be read: its error said): placed under the parent their card declares, marked not read."""
        root = {n.lower() for n in self.names}
        out = []
        for row in self.unread.itertuples():
            parents = [self.base if p.lower() in root else p for p in (row.parents if row.parents is not None else [])]
            out.append(
                Node(
                    model=row.model,
                    kind="quantization",
                    parent=parents[0] if parents else self.base,
                    parents=parents or [self.base],
                    confidence=0.0,
                    declared_relation="quantized",
                    declared_parents=parents,
                    note=f"not read ({row.reason}): placed as its card declares",
                )
            )
        return out

    def infer(self, pop: Population, stored: StoredTraces, only: Sequence[str] | None) -> Tree:
        """The tree, from the traces and their kept entries (read here: a damaged one is said in ``damaged``, and
        its model fitted on its trace alone)."""
        traces = stored.frame
        levels = [None if v != v else float(v) for v in traces["levels"]]
        entries, base_entries, damaged = pop.db.reads.trace_entries(traces)
        stored.damaged.update(damaged)
        return infer_tree(
            self.base,
            list(traces["model"]),
            stored.sketches,
            float(traces["scale"].iloc[0]),
            levels,
            adapters=self.embedded_on,
            declared=self.declared,
            base_names=self.names,
            rule=self.rule,
            only=only,
            untraced=self.untraced,
            statistics={name: list(traces[name]) for name in STATISTICS},
            quantized=self.quantized,
            copies=self.copies,
            entries=(entries, base_entries) if len(base_entries) else None,
        )
