"""The stored vectors a report reads, by their inner products: kept beside the store, checked to fit in memory first.

Shared by the cluster report and neighbour queries (light to import: a query loads no map, plot or Hub client).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pandas as pd

from ..analyse.scores import Geometry
from ..core.errors import NothingStoredError, ResourceError
from ..core.names import model_id
from ..represent.representation import Representation
from ..store import Products, Selection, Store, options_of
from ..store.products import BLOCK_FLOATS


def products_key(base: str, representation: Representation, what: str = "") -> str:
    """The name under which a selection's products are kept beside the store."""
    return f"{base}\n{representation.key()}\n{what}"


def stored_products(
    db: Store,
    selection: Selection,
    meta: pd.DataFrame,
    key: str,
    progress: Callable[[int, int], None] | None = None,
    verify: bool = True,
) -> tuple[Products, pd.DataFrame]:
    """The selection's products (kept beside the store), checked to fit in memory first, and the metadata of the
    vectors they cover (damaged ones left out: ``products.damaged`` names them; ``verify``: see ``Store.products``)."""
    check_fits(len(selection), selection.dim)
    products = db.products(selection, cache=key, progress=progress, verify=verify)
    return products, meta.iloc[products.kept].reset_index(drop=True)


def check_fits(n: int, dim: int) -> None:
    """One line, before any work, when the products of ``n`` vectors would not fit in the memory left (they and a
    few copies of n x n during the scores, and two blocks of vectors): what would fit instead."""
    need = 4 * 8 * n * n + 4 * min(BLOCK_FLOATS, 2 * n * max(dim, 1))
    free = available_memory()
    if free is not None and need > free:
        fits = int(((free - 4 * min(BLOCK_FLOATS, 2 * n * max(dim, 1))) / 32) ** 0.5)
        raise ResourceError(
            f"{n} models",
            f"their pairwise products need about {need / 2**30:.1f} GiB and {free / 2**30:.1f} GiB are free: "
            f"about {max(fits, 0):,} models fit at once here",
        )


def available_memory() -> int | None:
    """Bytes the kernel says can be allocated without swapping (MemAvailable), or None where it does not say."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def kept_spread(db: Store, hashes: list[str], key: str, geo: Geometry, scaling: str) -> None:
    """Each model's spread of distances (what mutual proximity ranks by) for ``scaling``, from beside the store where
    an earlier report kept it for these very vectors, else computed (an n^2 pass) and kept: a neighbour query of
    10,000 stored models then reads 2 x n numbers instead of every distance. ``hashes``: the checksums of the
    vectors ``geo`` holds, in its order."""
    if scaling == "none":
        return
    name = f"spread-{geo.metric}-{scaling}"
    kept = db.products_extra(hashes, key, name)
    if kept is not None and len(kept["mean"]) == len(geo):
        geo.use_spread(scaling, (kept["mean"], kept["sd"]))
        return
    stats = geo.spread(scaling)
    if stats is not None:
        db.put_products_extra(hashes, key, name, {"mean": stats[0], "sd": stats[1]})


def stored_base(db: Store, base: str | os.PathLike[str] | None, representation: Representation) -> str:
    """The base to compare against: the one given, else the only base with vectors under ``representation``."""
    if base is not None:
        from ..hub.ids import resolve_base

        names = [model_id(base)] if os.path.exists(str(base)) else [str(base), resolve_base(str(base)).canonical]
        for name in names:
            if not db.metadata(base=name, representation=representation).empty:
                return name
        raise NothingStoredError(
            str(base), f"no vectors stored for this base with representation {representation.key()}"
        )
    bases = sorted(set(db.metadata(representation=representation)["base"]))
    if not bases:
        stored = db.summary().drop_duplicates("params")
        other = [f"{p} ({options_of(s)})" for p, s in zip(stored["params"], stored["params_json"])]
        raise NothingStoredError(
            str(db.path),
            f"no vectors stored with representation {representation.key()}"
            + (
                f" (stored, with the options that read them: {', '.join(other)}; or embed again)"
                if other
                else "; run `modelvec embed` first"
            ),
        )
    if len(bases) > 1:
        raise NothingStoredError(
            str(db.path),
            f"holds vectors of {len(bases)} bases with representation {representation.key()} "
            f"({', '.join(bases)}): name one with --base",
        )
    return bases[0]
