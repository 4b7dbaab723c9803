"""What deciding the copies costs every report: a base's population at 1,000 to 10,000 traced models.

Every report reads a base's models through one :class:`~modelvec.store.Population`, which decides once which are
copies (identical weights, re-saves in another dtype: :mod:`modelvec.analyse.tree.copies`). A store is filled with N
made models of one base, each with a vector and a trace of the default trace's size (16,384 floats), as a Hub
population of a popular LLM base is: seven in ten bfloat16 fine-tunes, the rest float32, and 1 % bfloat16 re-saves
of float32 ones (trace = the original's plus the rounding). At each N, side by side in one process: the population
as a whole, the copies alone, and the query every population made before copies were decided (its vectors'
selection), so the ratio says what the copies add; and that every re-save is found, nothing else.

Run: ``python bench/bench_population.py [--sizes 1000,10000] [--dim 1000] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from modelvec.represent import Representation
from modelvec.represent.trace import TRACE_FLOATS, Trace
from modelvec.store import Population, Store, VectorRow
from modelvec.store.views.copies import copies

BASE = "org/base"
#: The expected rounding of each dtype against the weights (sqrt(sum ulp^2 / 12 / sum w^2) of normal weights).
ROUNDING = {"float32": 3.4e-8, "bfloat16": 1.1e-3}
SCALE = 100.0  # the base's weights' size in the traces' map


def rows(start: int, stop: int, dim: int, rng: np.random.Generator) -> list[VectorRow]:
    """Models ``start`` .. ``stop`` - 1: a delta of 1-10 % of the weights, bf16 or float32; every 100th a bf16
    re-save of the float32 model before it (its trace that model's plus rounding noise)."""
    out: list[VectorRow] = []
    previous: tuple[np.ndarray, str] | None = None
    for i in range(start, stop):
        if i % 100 == 99 and previous is not None:
            sketch = previous[0] + rng.standard_normal(TRACE_FLOATS) * ROUNDING["bfloat16"] * SCALE / TRACE_FLOATS**0.5
            precision, name = "bfloat16", f"{previous[1]}-bf16"
        else:
            sketch = rng.standard_normal(TRACE_FLOATS) * rng.uniform(0.01, 0.1) * SCALE / TRACE_FLOATS**0.5
            precision, name = ("bfloat16" if rng.random() < 0.7 else "float32"), f"u/model-{i:05d}"
        trace = Trace(sketch, 1.0, SCALE, 0.05, 0.0, 0.05, precision, ROUNDING[precision])
        out.append(
            VectorRow(
                model=name,
                model_version=f"git:{i:040x}",
                base=BASE,
                base_version="git:" + "b" * 40,
                representation=Representation(),
                architecture="llama",
                vector=rng.standard_normal(dim).astype(np.float32),
                datasets=[f"d{i % 6}"],
                source=f"hf://{name}@{i:040x}",
                seconds=0.1,
                adapter=False,
                trace=trace,
            )
        )
        previous = (sketch, name) if precision == "float32" else previous
    return out


def timed(work) -> tuple[float, object]:
    start = time.perf_counter()
    value = work()
    return time.perf_counter() - start, value


def measure(store: Path, n: int) -> dict:
    with Store(store, read_only=True) as db:
        key = Representation().key()
        select, _ = timed(lambda: db.reads.select(base=BASE, representation=key, base_hash="git:" + "b" * 40))
        whole, pop = timed(lambda: Population(db, BASE))
        meta = pop.models
        hashes = list(db.reads.select(base=BASE, representation=key, base_hash=pop.base_hash)[0].hashes)
        alone, found = timed(lambda: copies(db, BASE, key, pop.base_hash, meta, hashes, [BASE]))
    resaves = {m for m in meta["model"] if m.endswith("-bf16")}
    return {
        "models": n,
        "population_s": round(whole, 3),
        "copies_s": round(alone, 3),
        "selection_s": round(select, 3),
        "population_over_selection": round(whole / max(select, 1e-9), 1),
        "resaves": len(resaves),
        "found": len(found),
        "exactly_the_resaves": set(found) == resaves,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--dim", type=int, default=1000)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        store, have = Path(tmp) / "s.duckdb", 0
        for n in (int(s) for s in args.sizes.split(",")):
            with Store(store) as db:
                db.versions.record_base(BASE, "git:" + "b" * 40, "git:" + "b" * 40)
                for lo in range(have, n, 500):
                    db.writes.put_many(rows(lo, min(lo + 500, n), args.dim, rng))
            have = n
            results.append(measure(store, n))
            print(json.dumps(results[-1]))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
