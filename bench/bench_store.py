"""Loading 10,000 stored vectors of 50,000 floats into one numpy matrix: seconds, not minutes.

Rows are written the way the pipeline writes them (``Store.put``, one transaction each) for a
first batch, to time that path, and the rest in one bulk INSERT so the benchmark itself stays
short. The load goes through ``Store.load`` exactly as analysis code does. For scale, the same
bytes are also read from a raw ``.npy`` file (the floor for getting 2 GB into memory).

Run: ``python bench/bench_store.py [--rows 10000] [--dim 50000]``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from modelvec import Representation, Store
from modelvec.store import VectorRow


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--dim", type=int, default=50_000)
    parser.add_argument("--put-rows", type=int, default=200, help="rows written one by one through Store.put")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    params = Representation()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.duckdb"
        with Store(path) as db:
            start = time.perf_counter()
            for i in range(args.put_rows):
                db.put(VectorRow(f"model-{i:06d}", "h", "base", "bh", params, "bert",
                                 rng.standard_normal(args.dim, dtype=np.float32), ["ds"], "src", 0.1))
            put_s = (time.perf_counter() - start) / args.put_rows
            rest = args.rows - args.put_rows
            chunk = 500
            for lo in range(0, rest, chunk):
                n = min(chunk, rest - lo)
                flat = rng.standard_normal(n * args.dim, dtype=np.float32)
                bulk = pa.table({
                    "model": [f"model-{args.put_rows + lo + i:06d}" for i in range(n)],
                    "vector": pa.ListArray.from_arrays(pa.array(np.arange(0, (n + 1) * args.dim, args.dim, dtype=np.int32)), pa.array(flat)),
                })
                db.con.execute(
                    """INSERT INTO vectors (model, model_hash, base, base_hash, params, rank, factor, pooling, solver, sign,
                       params_json, architecture, dim, vector, datasets, source, seconds)
                       SELECT model, 'h', 'base', 'bh', ?, 8, 'U', 'mean', 'randomized', 'max-abs', '{}', 'bert', ?, vector,
                              ['ds'], 'src', 0.1 FROM bulk""",
                    [params.key(), args.dim],
                )
        size_gb = path.stat().st_size / 1e9
        with Store(path) as db:  # a fresh process-like open: nothing cached in the connection
            start = time.perf_counter()
            matrix, meta = db.load(base="base", params=params)
            load_s = time.perf_counter() - start
        assert matrix.shape == (args.rows, args.dim) and matrix.dtype == np.float32 and len(meta) == args.rows
        npy = Path(tmp) / "raw.npy"
        np.save(npy, matrix)
        del matrix
        start = time.perf_counter()
        np.load(npy)
        npy_s = time.perf_counter() - start
    print(json.dumps({
        "rows": args.rows, "dim": args.dim, "gigabytes": round(args.rows * args.dim * 4 / 1e9, 2),
        "store_file_gb": round(size_gb, 2), "put_ms_per_row": round(put_s * 1e3, 2),
        "load_s": round(load_s, 2), "raw_npy_load_s": round(npy_s, 2), "ratio_to_npy": round(load_s / npy_s, 2),
    }))


if __name__ == "__main__":
    main()
