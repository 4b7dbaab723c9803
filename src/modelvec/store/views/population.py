"""One base's stored vectors under one representation, as every report reads them: the only way from the store to
``cluster``, ``neighbors`` and ``tree``.

A :class:`Population` looks the base up once and decides once what belongs to it:

- the vectors embedded against the base **as it is now** (:meth:`~modelvec.store.versions.Versions.base_now`): rows
  embedded against an earlier version of it under the same name are counted (``stale``) and left out, never mixed in;
- of those, the models whose weights are the base's (an all-zero vector: a re-upload of the base, an untrained
  adapter) are ``copies``: counted, left off the map and out of every score.

It gives what the reports compute from, each verified before it is trusted (asked of the store's
:class:`~modelvec.store.derived.cache.CacheFolder`): the
vectors' inner products kept beside the store (a row that does not verify is computed again), each model's spread
for mutual proximity (computed again where it does not verify), the traces (a damaged one left out and named), the
vectors themselves (each checked against its checksum). What it found and redid is ``repaired`` (one line each);
stored vectors or traces whose bytes are damaged are ``damaged`` (model -> one line). It resolves the scoring once
(``auto`` from whether the models are adapters), and asks :mod:`modelvec.hub.basefiles` where a Hub base's files are
on this machine.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ...analyse.proximity import SCALED_MAX_N
from ...analyse.scores import Geometry, Scoring
from ...analyse.tree.copies import Copy
from ...core import machine
from ...core.errors import NothingStoredError, ResourceError
from ...core.names import is_hub_id
from ...represent.representation import Representation
from ..derived.cache import CacheFolder, checksum_of
from ..derived.products import Products, held_bytes
from ..formats.blocks import BlockReader, Selection, products_with
from ..reads import StoredTraces
from ..store import Store
from .bases import base_names, find_base, names_of, query_name, stored_base
from .copies import copies as find_copies
from .copies import declared
from .snapshot import Snapshot

if TYPE_CHECKING:
    from ...hub.client import HubSettings


class Population:
    """The vectors of ``base`` under ``representation`` that the reports analyse (see the module's docstring).

    ``name``: the base as stored; ``base_hash``: its version now; ``selection`` and ``meta``: its models' vectors
    (copies of the base and quantizations left out), rows ordered by model; ``copies``: the models whose weights
    are the base's; ``quantized``: the quantizations (GGUF, GPTQ, AWQ, bitsandbytes); ``stale``: vectors embedded against an earlier
    version of the base, left out."""

    def __init__(
        self, db: Store, base: str | os.PathLike[str] | None, representation: Representation | None = None
    ) -> None:
        self.db = db
        #: the files kept beside the store (products, spreads, pairs, layouts, the tree)
        self.folder = CacheFolder(db.path)
        self.representation = representation or Representation()
        names = base_names(base) if base is not None else None
        stored = Snapshot(
            db.connection, names, self.representation
        )  # the one read of the store's rows: the rest follows
        self.name = find_base(db, base, self.representation, names, stored.bases())
        self.repaired: list[str] = []
        self.damaged: dict[str, str] = {}
        self.base_hash, self.stale = self._version(stored)
        selection, meta = stored.select(self.name, self.base_hash)
        #: models with stale vectors and none of the base as it is now (not embedded again since)
        self.stale_only = len(stored.models(self.name) - set(meta["model"]))
        #: every model of the population with its metadata, the copies and quantizations among them (for the tree)
        self.models: pd.DataFrame = meta
        #: copies (identical weights, re-saves in another dtype, the base's weights) with the model each copies
        self.copies: dict[str, Copy] = find_copies(
            db, self.name, self.representation.key(), self.base_hash, meta, selection.hashes, self.names_in_cards()
        )
        copy = meta["model"].isin(set(self.copies)).to_numpy(dtype=bool)
        rounded = meta["quantized"].notna().to_numpy(dtype=bool) & ~copy
        #: quantizations (GGUF, GPTQ, AWQ, bitsandbytes weights): placed in the tree by their traces, no points on the map
        self.quantized: list[str] = list(meta["model"][rounded])
        at = np.flatnonzero(~copy & ~rounded)
        self.selection = Selection(
            [selection.models[i] for i in at],
            [selection.offsets[i] for i in at],
            [selection.hashes[i] for i in at],
            selection.dim,
        )
        self.meta = meta.iloc[at].reset_index(drop=True)

    def _version(self, snapshot: Snapshot) -> tuple[str, int]:
        """The base's version the population was embedded against, and how many vectors were embedded against
        others: its version now, or (where nothing says what it is now) the one embedded against last."""
        versions = snapshot.stored(self.name)
        now = snapshot.base_now(self.name)
        if now is None:
            now = str(versions.sort_values("newest")["base_hash"].iloc[-1])
        if now not in set(versions["base_hash"]):
            raise NothingStoredError(
                self.name,
                f"the base has changed since its {int(versions['vectors'].sum())} vectors under "
                f"{self.representation.key()} were embedded against it: embed its fine-tunes again "
                "(modelvec embed re-embeds them against the base as it is now)",
            )
        return now, int(versions.loc[versions["base_hash"] != now, "vectors"].sum())

    @classmethod
    def of_query(
        cls,
        db: Store,
        model: str | os.PathLike[str],
        base: str | os.PathLike[str] | None,
        representation: Representation | None,
    ) -> Population:
        """The population a query about ``model`` is answered in: of ``base``, else of the base ``model`` (or the
        model it is an alias of) is stored with, else of ``model`` itself where it is a stored base, else of the only
        stored base."""
        representation = representation or Representation()
        if base is None:
            name = query_name(model)
            own = db.reads.metadata(representation=representation, models=[db.reads.aliases().get(name, name)])
            base = own["base"].iloc[0] if len(own) else stored_base(db, model, representation)
        return cls(db, base, representation)

    def is_base(self, model: str | os.PathLike[str]) -> bool:
        """Whether ``model`` names this population's base (its stored name, its path, its Hub ids)."""
        return self.name == query_name(model) or self.name in names_of(model)

    def stored_name(self, model: str | os.PathLike[str]) -> str:
        """How the store names ``model``: the model a second name of it (an alias) names, else its own name."""
        name = query_name(model)
        return self.db.reads.aliases(self.name).get(name, name)

    # --- what the reports say of it ------------------------------------------------------------------
    def left_out(self, *, off_map: bool = True) -> list[str]:
        """What the population leaves out and why, one line each: the stale rows, and (``off_map``) the models the
        map leaves off, the copies of the base and the quantizations (the tree places them)."""
        out = []
        if self.stale:
            if self.stale_only:
                what = (
                    f"{self.stale_only} of their models have no vector of the base as it is now: embed them again, or"
                )
            else:
                what = "their models are embedded again since:"
            out.append(
                f"{self.stale} stored vector{'s' if self.stale != 1 else ''} of {self.name} were embedded against an "
                f"earlier version of the base and are left out; {what} drop them with `modelvec compact`"
            )
        if self.quantized and off_map:
            n = len(self.quantized)
            out.append(
                f"{n} quantization{'s' if n != 1 else ''} left off the map and out of every score; `modelvec "
                f"tree` places {'them' if n != 1 else 'it'}: {', '.join(self.quantized[:3])}{', ...' if n > 3 else ''}"
            )
        of_base = [m for m, c in self.copies.items() if c.original == self.name]
        of_models = [m for m, c in self.copies.items() if c.original != self.name]
        if of_base and off_map:
            n = len(of_base)
            how = "" if all(self.copies[m].exact for m in of_base) else ", or re-saved in another dtype"
            out.append(
                f"{n} model{'s' if n != 1 else ''} whose weights are the base's (a copy of the base{how}) left off the "
                f"map and out of every score: {', '.join(of_base[:3])}{', ...' if n > 3 else ''}"
            )
        if of_models and off_map:
            n = len(of_models)
            out.append(
                f"{n} cop{'ies' if n != 1 else 'y'} of other stored models (identical weights, or re-saved in another "
                f"dtype) left off the map and out of every score, each counted once as its original: "
                f"{', '.join(of_models[:3])}{', ...' if n > 3 else ''}"
            )
        return out

    # --- the vectors' products and geometry ----------------------------------------------------------
    def cache_key(self, what: str = "") -> str:
        """The name under which this population's products are kept beside the store."""
        return f"{self.name}\n{self.representation.key()}\n{what}"

    def products(
        self, progress: Callable[[int, int], None] | None = None, *, verify: bool = True, device: str = "auto"
    ) -> tuple[Products, pd.DataFrame]:
        """The vectors' inner products, kept beside the store and verified (checked to fit in memory first), and the
        metadata of the vectors they cover (damaged ones left out: ``damaged`` names them). ``verify``: read and
        check every vector even where all their products are kept (a query reads only those it shows:
        :meth:`check`). ``device``: the torch device of its float32 products
        (:class:`~modelvec.store.derived.products.Compute`)."""
        check_fits(len(self.selection), self.selection.dim)
        products = self.db.reads.products(
            self.selection, cache=self.cache_key(), progress=progress, verify=verify, device=device
        )
        self.repaired += products.notes
        self.damaged.update(products.damaged)
        return products, self.meta.iloc[products.positions].reset_index(drop=True)

    def standardized(self) -> Products:
        """The products of the vectors with every feature standardised over the population (kept the same way, for
        exactly these vectors: their means are the population's)."""
        sel = self.selection
        key = self.cache_key(f"standardized\n{len(sel)}:{checksum_of(sel.hashes)}")
        products = self.db.reads.products(sel, cache=key, standardize=True)
        self.repaired += products.notes
        return products

    def resolve(self, scoring: Scoring, adapters: Sequence[object] | None = None) -> tuple[Scoring, str | None]:
        """``scoring`` with ``auto`` resolved, once, from whether the models are adapters (``adapters``: per model,
        default this population's), and why it chose so."""
        scaling, note = scoring.scaling_for(list(self.meta["adapter"]) if adapters is None else adapters)
        return replace(scoring, scaling=scaling), note

    def geometry(self, products: Products, scoring: Scoring) -> Geometry:
        """The geometry of ``products`` for a resolved ``scoring``, each model's spread for mutual proximity taken
        from beside the store where it was kept for these very vectors and verifies, else computed and kept."""
        geo = Geometry.from_products(products.gram, scoring.metric)
        if scoring.scaling == "none":
            return geo

        def spread() -> dict[str, np.ndarray]:
            stats = geo.spread(scoring.scaling)
            assert stats is not None  # a scaling other than none has a spread
            return {"mean": stats[0], "sd": stats[1]}

        kept = self.derived(products, f"spread-{geo.metric}-{scoring.scaling}", spread)
        if len(kept["mean"]) == len(geo) and len(kept["sd"]) == len(geo):
            geo.use_spread(scoring.scaling, (kept["mean"], kept["sd"]))
        return geo

    def rank_all(self, geo: Geometry, products: Products, scaling: str) -> None:
        """Every pair's ``scaling`` distance, for the scores that rank every model's neighbours: read (mapped) from
        beside the store where it was kept for these very vectors and verifies, else computed and kept (nothing for
        plain distances, or above the rows whose pairs are kept: :data:`~modelvec.analyse.proximity.SCALED_MAX_N`)."""
        if scaling == "none" or len(geo) > SCALED_MAX_N:
            return

        def every_pair() -> dict[str, np.ndarray]:
            full = geo.every_pair(scaling)
            assert full is not None  # a scaling, and no more rows than are kept
            return {"pairs": full}

        kept = self.derived(products, f"pairs-{geo.metric}-{scaling}", every_pair, mapped=True)
        geo.use_every_pair(scaling, kept["pairs"])

    def derived(
        self,
        products: Products | np.ndarray,
        name: str,
        compute: Callable[[], dict[str, np.ndarray]],
        *,
        mapped: bool = False,
        inputs: str = "",
    ) -> dict[str, np.ndarray]:
        """Arrays that follow from exactly the vectors of ``products`` (a spread, a map's coordinates), kept beside
        the store under ``name``: read where they were kept for these very vectors and verify (a file that does not
        is said in ``repaired``), else ``compute()`` and kept. ``mapped``: kept arrays as memory maps (large ones).
        ``inputs``: a digest of what else they follow from (the labels, say): kept for other inputs is not kept."""
        at = products.positions if isinstance(products, Products) else products
        hashes = [self.selection.hashes[i] for i in at] + ([inputs] if inputs else [])
        found, note = self.folder.derived(self.cache_key(), hashes, name, mapped=mapped)
        if note is not None:
            self.repaired.append(note)
        if found is not None:
            return found
        arrays = compute()
        self.folder.keep_derived(self.cache_key(), hashes, name, arrays)
        return arrays

    def products_with(self, vector: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One pass over the vectors: their inner products with ``vector`` and their squared norms, at ``positions``
        of ``selection`` (a damaged vector's are NaN and it is named in ``damaged``)."""
        dots, squares, damaged = products_with(self.db.vector_file, self.selection, vector)
        self.damaged.update(damaged)
        return dots[positions], squares[positions]

    # --- the vectors themselves ---------------------------------------------------------------------
    def rows(self, positions: Sequence[int] | np.ndarray) -> np.ndarray:
        """The vectors at these positions of ``selection``, each checked against its checksum."""
        at = [int(i) for i in positions]
        sel = self.selection
        return self.db.vector_file.read(
            [sel.offsets[i] for i in at], sel.dim, [sel.hashes[i] for i in at], [sel.models[i] for i in at]
        )

    def check(self, positions: Sequence[int] | np.ndarray) -> list[int]:
        """Which of these positions of ``selection`` hold vectors whose bytes match their checksums (the others are
        named in ``damaged``): what a query that reads only the kept products checks of what it shows."""
        reader = BlockReader(self.db.vector_file, self.selection, 1)
        bad = reader.check([int(i) for i in positions])
        self.damaged.update(reader.damaged)
        return [int(i) for i in positions if int(i) not in bad]

    # --- the traces ----------------------------------------------------------------------------------
    def traces(self, *, read: bool = True) -> StoredTraces:
        """The traces of the population's models (copies of the base among them), each verified: a damaged one is
        left out and named in ``damaged``; ``read=False``: their rows alone, no sketch read."""
        stored = self.db.reads.traces(self.name, self.representation.key(), self.base_hash, read=read)
        for model, line in stored.damaged.items():
            self.damaged[model] = line
        return stored

    def kept_tree(self, key: str) -> dict[str, Any] | None:
        """The model tree kept beside the store for exactly ``key`` (what it was inferred from), verified; None where
        there is none (or it does not verify: said in ``repaired``, and computed again)."""
        tree, note = self.folder.tree(self.cache_key("tree"), key)
        if note is not None:
            self.repaired.append(note)
        return tree

    def keep_tree(self, key: str, tree: dict[str, Any]) -> None:
        """Keep the model tree (its JSON) inferred from ``key`` beside the store: a later query reads it, not every
        trace."""
        self.folder.keep_tree(self.cache_key("tree"), key, tree)

    def catalogue(self) -> pd.DataFrame:
        return self.db.reads.catalogue(base=self.name)

    # --- the base's files ----------------------------------------------------------------------------
    def base_files(self, hub_settings: HubSettings, *, fetch: bool = False) -> str | None:
        """The base's files on this machine: its folder, or a Hub base's snapshot in the Hub cache, or the rows of it
        that embed fetched, at the version the population was embedded against; with ``fetch``, a Hub base not in
        the cache is fetched (``neighbors --explain``; ``cluster`` works offline: None)."""
        if os.path.exists(self.name):
            return self.name
        if not is_hub_id(self.name):
            return None
        from ...hub.basefiles import base_files

        return base_files(self.name, self.base_hash, hub_settings, fetch=fetch)

    def state(self, model: str) -> str | None:
        """What the reports make of one of the population's models, in a few words: a copy (of the base, of another
        model, a re-save) or a quantization; None for a model on the map."""
        if model in self.copies:
            return self.copies[model].describe(self.name)
        return "a quantization: in the tree, off the map" if model in self.quantized else None

    def describe(self) -> dict[str, Any]:
        """What the population is, for a report's JSON: its base's version, the stale rows, the copies (each with its
        original and why that one is) and the quantizations."""
        return {
            "base_hash": self.base_hash,
            "stale": self.stale,
            "copies": [m for m, c in self.copies.items() if c.original == self.name],
            "copies_of_models": {m: asdict(c) for m, c in self.copies.items() if c.original != self.name},
            "quantized": list(self.quantized),
        }

    def names_in_cards(self) -> list[str]:
        """Every name of the base a card may use: as stored, as a local folder's bare name, its Hub id's names (a local
        base in the Hub's cache: the id of the repository it is a snapshot of)."""
        names = [self.name, Path(self.name).name]
        cached = (
            [p for p in Path(self.name).resolve().parts if p.startswith("models--")] if not is_hub_id(self.name) else []
        )
        names += [cached[-1].removeprefix("models--").replace("--", "/")] if cached else []  # a Hub cache snapshot
        if is_hub_id(self.name):
            from ...hub.ids import resolve_base

            names += list(resolve_base(self.name).names)
        return list(dict.fromkeys(names))

    def declared(self) -> dict[str, tuple[str | None, list[str]]]:
        """What each model's card declares (relation, parents as stored names; the base by its stored name)."""
        return declared(self.db, self.name, self.models, self.names_in_cards())


def check_fits(n: int, dim: int) -> None:
    """One line, before any work, when the products of ``n`` vectors would not fit in the memory left (they and a
    few copies of n x n during the scores, and two blocks of vectors): what would fit instead."""
    need = 4 * 8 * n * n + held_bytes(n, dim)
    free = machine.available_memory()
    if free is not None and need > free:
        fits = int(((free - held_bytes(n, dim)) / 32) ** 0.5)
        raise ResourceError(
            f"{n} models",
            f"their pairwise products need about {need / 2**30:.1f} GiB and {free / 2**30:.1f} GiB are free: "
            f"about {max(fits, 0):,} models fit at once here",
        )
