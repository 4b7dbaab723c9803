"""What the default reads of a real LLM's checkpoint, and what fetching a population of them costs.

The read plan follows from the shapes alone (:func:`modelvec.represent.read_plan`), so each size is a checkpoint of
the real model's shapes and vocabulary (Llama 3.2 1B and 3B, Llama 3.1 8B and 70B, bf16, sharded as the Hub's are)
whose tensors are never written: every shard is its real safetensors header followed by a sparse region of the
shard's size (no disk used). For each size it prints the bytes the default reads of a fine-tune, that share of its
weight bytes, and the hours 1,000 and 10,000 such fine-tunes take at 1 and 10 Gbit/s at the link's floor (bytes ÷
bandwidth; the overhead of requests above that floor is measured by ``bench_llm --hub``), beside the rule before
2026-11-27 (5 % of each matrix's rows, ``--auto-rows share``).

Run: ``python bench/bench_budget.py [--sizes 1b,3b,8b,70b] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from hollow import llama_config, llama_tensors, write_hollow

SIZES = {  # layers, hidden, intermediate, heads, kv heads, vocabulary, tied embeddings
    "1b": (16, 2048, 8192, 32, 8, 128256, True),
    "3b": (28, 3072, 8192, 24, 8, 128256, True),
    "8b": (32, 4096, 14336, 32, 8, 128256, False),
    "70b": (80, 8192, 28672, 64, 8, 128256, False),
}
SHARD_BYTES = 5 << 30  # the Hub's usual shard size


def write_sparse(size: str, folder: Path) -> int:
    """A checkpoint folder of ``size``'s shapes whose shards hold real headers and no written data; its bytes."""
    layers, d, ff, heads, kv, vocab, tied = SIZES[size]
    config = llama_config(layers, d, ff, heads, kv, d // heads, vocab, tie_word_embeddings=tied)
    return write_hollow(folder, config, llama_tensors(config, norms=True, head=not tied), SHARD_BYTES)


def read_bytes(folder: Path, **fields: object) -> tuple[int, int]:
    """The bytes the representation reads of a fine-tune in ``folder`` (rows x columns x 2 of each planned tensor),
    and the number of contiguous row ranges (each at most one range request)."""
    from modelvec.read import Checkpoint
    from modelvec.represent import Representation, read_plan

    ck = Checkpoint(folder)
    plan = read_plan(ck, Representation(**fields), base=False)  # type: ignore[arg-type]
    got = ranges = 0
    for tensor, rows in plan.items():
        shape = ck.shape(tensor)
        cols = int(shape[1]) if shape and len(shape) > 1 else 1
        got += sum(b - a for a, b in rows) * cols * 2
        ranges += len(rows)
    return got, ranges


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=",".join(SIZES))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = []
    print(
        f"{'size':>4} {'weights':>9} {'default':>10} {'share':>6} {'ranges':>6} {'5 % rule':>10} {'share':>6}"
        "  hours: 1k at 1, 10 Gbit/s; 10k at 1, 10 Gbit/s"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes.split(","):
            folder = Path(tmp) / size
            total = write_sparse(size, folder)
            now, ranges = read_bytes(folder)
            before, _ = read_bytes(folder, auto_rows="share")
            hours = {f"{n}@{g}gbit": now * n * 8 / (g * 1e9) / 3600 for n in (1000, 10000) for g in (1, 10)}
            rows.append(dict(size=size, weight_bytes=total, read=now, ranges=ranges, read_before=before, hours=hours))
            print(
                f"{size:>4} {total / 1e9:7.2f}GB {now / 1e6:8.1f}MB {now / total:6.2%} {ranges:6d} "
                f"{before / 1e6:8.1f}MB {before / total:6.2%}  " + " ".join(f"{v:.2f}" for v in hours.values())
            )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
