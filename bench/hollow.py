"""Llama-shaped checkpoints whose tensors are holes, for the benchmarks that need a real layout but no weights.

What fetching byte ranges costs, and what the read plan takes of a checkpoint, follow from its layout alone: each
shard is its real safetensors header followed by a sparse region of the shard's size (zeros, never written, no
disk used). Shared by ``bench_llm --hollow`` (the fetch stream) and ``bench_budget`` (the bytes the default reads).
"""

from __future__ import annotations

import json
from pathlib import Path

#: The projections of one Llama layer, as stored (out x in), from its dimensions.
LAYER = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
MLP = ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def llama_config(layers: int, d: int, ff: int, heads: int, kv: int, hd: int, vocab: int, **extra: object) -> dict:
    """A ``config.json`` of a bf16 Llama of these dimensions (``extra``: more keys, ``tie_word_embeddings``...)."""
    return {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": d,
        "intermediate_size": ff,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": hd,
        "vocab_size": vocab,
        "torch_dtype": "bfloat16",
        **extra,
    }


def llama_tensors(config: dict, *, norms: bool = False, head: bool = False) -> list[tuple[str, tuple[int, ...]]]:
    """Every tensor of the model ``config`` describes, in order, with its stored shape: the embeddings, each layer's
    projections (``norms``: and its two norms), (``norms``) the last norm and (``head``) an untied ``lm_head``."""
    d, ff, hd = config["hidden_size"], config["intermediate_size"], config["head_dim"]
    q, kv = config["num_attention_heads"] * hd, config["num_key_value_heads"] * hd
    shapes = dict(zip(LAYER + MLP, [(q, d), (kv, d), (kv, d), (d, q), (ff, d), (ff, d), (d, ff)]))
    out: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (config["vocab_size"], d))]
    for i in range(config["num_hidden_layers"]):
        out += [(f"model.layers.{i}.{name}.weight", shape) for name, shape in shapes.items()]
        if norms:
            out += [(f"model.layers.{i}.{n}.weight", (d,)) for n in ("input_layernorm", "post_attention_layernorm")]
    if norms:
        out.append(("model.norm.weight", (d,)))
    if head:
        out.append(("lm_head.weight", (config["vocab_size"], d)))
    return out


def _bytes(shape: tuple[int, ...]) -> int:
    n = 2
    for s in shape:
        n *= s
    return n


def write_hollow(folder: Path, config: dict, tensors: list[tuple[str, tuple[int, ...]]], shard_bytes: int) -> int:
    """``folder`` as a sharded bf16 checkpoint of ``tensors`` (a shard closed once it holds ``shard_bytes``, as
    ``save_pretrained`` closes them), its tensors holes; the bytes of its weight files."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    for key, shape in tensors:
        if sum(_bytes(s) for _, s in shards[-1]) >= shard_bytes:
            shards.append([])
        shards[-1].append((key, shape))
    weight_map, total = {}, 0
    for i, part in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        header, at = {}, 0
        for key, shape in sorted(part):
            header[key] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [at, at + _bytes(shape)]}
            at, weight_map[key] = at + _bytes(shape), name
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        with open(folder / name, "wb") as f:
            f.write(len(raw).to_bytes(8, "little") + raw)
            f.truncate(8 + len(raw) + at)  # sparse: no data written
        total += 8 + len(raw) + at
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return total
