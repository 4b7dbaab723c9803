"""Loading 10,000 stored vectors of 50,000 floats into one numpy matrix: seconds, not minutes.

Rows are written the way the pipeline writes them (``Store.writes.put``, one transaction each) for a
first batch, to time that path, and the rest 500 rows per transaction (``Store.writes.put_many``) so
the benchmark itself stays short. The load goes through ``Store.reads.load`` exactly as analysis code does. For scale, the same
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

from modelvec import Representation, Store
from modelvec.store import VectorRow


def _row(i: int, params: Representation, vector: np.ndarray) -> VectorRow:
    """One made row, as the pipeline would write it."""
    return VectorRow(f"model-{i:06d}", "h", "base", "bh", params, "bert", vector, ["ds"], "src", 0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--dim", type=int, default=50_000)
    parser.add_argument("--put-rows", type=int, default=200, help="rows written one by one through Store.writes.put")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    params = Representation()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.duckdb"
        with Store(path) as db:
            start = time.perf_counter()
            for i in range(args.put_rows):
                db.writes.put(_row(i, params, rng.standard_normal(args.dim, dtype=np.float32)))
            put_s = (time.perf_counter() - start) / args.put_rows
            rest = args.rows - args.put_rows
            chunk = 500
            for lo in range(0, rest, chunk):
                n = min(chunk, rest - lo)
                flat = rng.standard_normal((n, args.dim), dtype=np.float32)
                db.writes.put_many([_row(args.put_rows + lo + i, params, flat[i]) for i in range(n)])
        size_gb = (path.stat().st_size + Path(f"{path}.vectors").stat().st_size) / 1e9
        load_s = []
        for _ in range(2):  # the first read after writing is slower here (page cache state), the second is warm
            with Store(path) as db:  # a fresh process-like open: nothing cached in the connection
                start = time.perf_counter()
                matrix, meta = db.reads.load(base="base", representation=params)
                load_s.append(time.perf_counter() - start)
            assert matrix.shape == (args.rows, args.dim) and matrix.dtype == np.float32 and len(meta) == args.rows
            if len(load_s) == 1:
                del matrix
        npy = Path(tmp) / "raw.npy"
        np.save(npy, matrix)
        del matrix
        start = time.perf_counter()
        np.load(npy)
        npy_s = time.perf_counter() - start
    print(
        json.dumps(
            {
                "rows": args.rows,
                "dim": args.dim,
                "gigabytes": round(args.rows * args.dim * 4 / 1e9, 2),
                "store_file_gb": round(size_gb, 2),
                "put_ms_per_row": round(put_s * 1e3, 2),
                "first_load_after_write_s": round(load_s[0], 2),
                "warm_load_s": round(load_s[1], 2),
                "raw_npy_load_s": round(npy_s, 2),
                "warm_ratio_to_npy": round(load_s[1] / npy_s, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
