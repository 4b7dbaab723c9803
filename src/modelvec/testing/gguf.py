"""Safetensors folders written as GGUF files the way llama.cpp's converter writes them (``convert_hf_to_gguf.py``):
gguf's own tensor names and metadata, Llama's Q/K row permutation, GPT-2's Conv1D transpose, each 2-D weight
quantized by the ``gguf`` package's own quantizers (Q8_0, Q4_0: those it implements; K-quants need llama.cpp's).

For the tests and the evidence (modelvec reads GGUF with :mod:`modelvec.read.gguf`; it writes none).
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
from safetensors.torch import load_file

Q = gguf.GGMLQuantizationType


def permute(w: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    """llama.cpp's ``LlamaModel.permute`` (convert_hf_to_gguf.py), applied to q_proj and k_proj."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(
    folder: Path,
    path: Path,
    arch: str,
    qtype=Q.F32,
    *,
    extra: dict[str, tuple[np.ndarray, Q]] | None = None,
    vocabulary: int = 0,
    split: int = 0,
) -> Path:
    """The safetensors folder as a GGUF file: llama.cpp's names, metadata and layout; 2-D weights in ``qtype``.
    ``extra``: more tensors, each stored bytes (uint8, a row of blocks a row) of its type; ``vocabulary``: that many
    tokens in the metadata (``tokenizer.ggml.tokens``: a header of megabytes, as a real model's); ``split``: at most that
    many tensors a file, as ``gguf-split --split-max-tensors`` writes them (``<stem>-00001-of-0000N.gguf``: the first
    part's path is returned)."""
    config = json.loads((folder / "config.json").read_text())
    state = load_file(str(folder / "model.safetensors"))
    writer = gguf.GGUFWriter(path, arch, split_max_tensors=split)
    if arch == "gpt2":
        n_layers, width, ff, heads = (
            config["n_layer"],
            config["n_embd"],
            config.get("n_inner") or 4 * config["n_embd"],
            config["n_head"],
        )
    elif arch == "t5":
        n_layers, width, ff, heads = config["num_layers"], config["d_model"], config["d_ff"], config["num_heads"]
        writer.add_decoder_block_count(config["num_decoder_layers"])
    else:
        n_layers, width, ff, heads = (
            config["num_hidden_layers"],
            config["hidden_size"],
            config["intermediate_size"],
            config["num_attention_heads"],
        )
    writer.add_block_count(n_layers)
    writer.add_embedding_length(width)
    writer.add_feed_forward_length(ff)
    writer.add_head_count(heads)
    if arch == "llama":
        writer.add_head_count_kv(config["num_key_value_heads"])
    names = gguf.get_tensor_name_map({v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}[arch], n_layers + 1)
    written = set()
    for key, value in state.items():
        name = names.get_name(key, try_suffixes=(".weight", ".bias"))
        if name is None or name in written:
            continue
        written.add(name)
        data = value.float().numpy()
        if arch == "llama" and key.endswith("q_proj.weight"):
            data = permute(data, heads, heads)
        elif arch == "llama" and key.endswith("k_proj.weight"):
            data = permute(data, heads, config["num_key_value_heads"])
        elif arch == "gpt2" and key.endswith((".c_attn.weight", ".c_proj.weight", ".c_fc.weight")):
            data = data.T  # the converter stores GPT-2's Conv1D [in, out] as ggml's [out, in]
        data = np.ascontiguousarray(data)
        if data.ndim == 2 and qtype != Q.F32:
            writer.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(name, data)
    if vocabulary:
        writer.add_token_list([f"token-{i:07d}-{'x' * (i % 23)}" for i in range(vocabulary)])
    for name, (raw, kind) in (extra or {}).items():
        writer.add_tensor(name, raw, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    parts = writer.format_shard_names(path)
    return parts[0]
