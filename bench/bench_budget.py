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
import struct
import tempfile
from pathlib import Path

SIZES = {  # layers, hidden, intermediate, heads, kv heads, vocabulary, tied embeddings
    "1b": (16, 2048, 8192, 32, 8, 128256, True),
    "3b": (28, 3072, 8192, 24, 8, 128256, True),
    "8b": (32, 4096, 14336, 32, 8, 128256, False),
    "70b": (80, 8192, 28672, 64, 8, 128256, False),
}
SHARD_BYTES = 5 << 30  # the Hub's usual shard size


def shapes_of(size: str) -> dict[str, tuple[int, ...]]:
    """Every tensor of the model, in order, with its shape."""
    layers, d, ff, heads, kv, vocab, tied = SIZES[size]
    hd = d // heads
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, d)}
    for i in range(layers):
        p = f"model.layers.{i}."
        out |= {
            p + "self_attn.q_proj.weight": (heads * hd, d),
            p + "self_attn.k_proj.weight": (kv * hd, d),
            p + "self_attn.v_proj.weight": (kv * hd, d),
            p + "self_attn.o_proj.weight": (d, heads * hd),
            p + "mlp.gate_proj.weight": (ff, d),
            p + "mlp.up_proj.weight": (ff, d),
            p + "mlp.down_proj.weight": (d, ff),
            p + "input_layernorm.weight": (d,),
            p + "post_attention_layernorm.weight": (d,),
        }
    out["model.norm.weight"] = (d,)
    if not tied:
        out["lm_head.weight"] = (vocab, d)
    return out


def write_sparse(size: str, folder: Path) -> int:
    """A checkpoint folder of ``size``'s shapes whose shards hold real headers and no written data; its bytes."""
    layers, d, ff, heads, kv, vocab, tied = SIZES[size]
    config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": d,
        "intermediate_size": ff,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "vocab_size": vocab,
        "tie_word_embeddings": tied,
        "torch_dtype": "bfloat16",
    }
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    shards: list[dict[str, tuple[int, ...]]] = [{}]
    used = 0
    for name, shape in shapes_of(size).items():
        n = 2
        for s in shape:
            n *= s
        if used and used + n > SHARD_BYTES:
            shards.append({})
            used = 0
        shards[-1][name] = shape
        used += n
    weight_map, total = {}, 0
    for i, shard in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        header, offset = {}, 0
        for name, shape in shard.items():
            n = 2
            for s in shape:
                n *= s
            header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + n]}
            offset += n
            weight_map[name] = file
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        with open(folder / file, "wb") as f:
            f.write(struct.pack("<Q", len(text)) + text)
            f.truncate(8 + len(text) + offset)  # sparse: no data written
        total += 8 + len(text) + offset
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return total


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
