"""Architectures as data: one declarative table per model family.

Each table says which tensor names (templates with ``${layer}``, as in mergekit) hold which role:
the stack (encoder/decoder), the layer, the family (q, k, v, o, ff_gate, ff1, ff2, and cross_q ...
cross_o for the cross-attention of encoder-decoder decoders), the storage orientation, and the parts
of fused tensors. Names are written without the prefixes that task heads add (``bert.``,
``roberta.``, ``transformer.``, ``model.``...); each table lists the prefixes it accepts.

Adding a family is adding an entry to :data:`ARCHITECTURES`; nothing else in modelvec branches on
the family. Reading it from GGUF files is one more entry, of data too: how the file's metadata and
tensors give the table's config (:data:`modelvec.read.gguf_families.FAMILIES`). The terms the tables are
written in, and what reads them against a config, are :mod:`modelvec.read.roles`'.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ..core.errors import ArchitectureError
from .roles import ATTENTION, CROSS_ATTENTION, Architecture, Orientation, Stack, Tensor, VocabularyHead, When


def _attention(template: str, names: tuple[str, str, str, str], families=ATTENTION) -> tuple[Tensor, ...]:
    return tuple(Tensor(template=template.replace("{}", n), families=(f,)) for n, f in zip(names, families))


_BERT_LIKE_STACK = Stack(
    "encoder",
    ("num_hidden_layers",),
    (
        Tensor(template="encoder.layer.${layer}.attention.self.query.weight", families=("q",)),
        Tensor(template="encoder.layer.${layer}.attention.self.key.weight", families=("k",)),
        Tensor(template="encoder.layer.${layer}.attention.self.value.weight", families=("v",)),
        Tensor(template="encoder.layer.${layer}.attention.output.dense.weight", families=("o",)),
        Tensor(template="encoder.layer.${layer}.intermediate.dense.weight", families=("ff1",)),
        Tensor(template="encoder.layer.${layer}.output.dense.weight", families=("ff2",)),
    ),
)

_T5_FFN_GATED = When("feed_forward_proj", "gated-*", default="relu")


def _t5_stack(name: str, layers_keys: tuple[str, ...], cross: bool) -> Stack:
    block = f"{name}.block.${{layer}}.layer"
    ff = 2 if cross else 1
    tensors = list(_attention(block + ".0.SelfAttention.{}.weight", ("q", "k", "v", "o")))
    if cross:
        tensors += _attention(block + ".1.EncDecAttention.{}.weight", ("q", "k", "v", "o"), CROSS_ATTENTION)
    tensors += [
        Tensor(template=f"{block}.{ff}.DenseReluDense.wi.weight", families=("ff1",), unless=_T5_FFN_GATED),
        Tensor(template=f"{block}.{ff}.DenseReluDense.wi_0.weight", families=("ff_gate",), when=_T5_FFN_GATED),
        Tensor(template=f"{block}.{ff}.DenseReluDense.wi_1.weight", families=("ff1",), when=_T5_FFN_GATED),
        Tensor(template=f"{block}.{ff}.DenseReluDense.wo.weight", families=("ff2",)),
    ]
    return Stack(name, layers_keys, tuple(tensors))


BERT = Architecture(
    name="bert",
    model_types=("bert",),
    class_prefixes=("Bert",),
    prefixes=("bert.", ""),
    stacks=(_BERT_LIKE_STACK,),
    description="BERT (bert-base-uncased, MiniLM, ...)",
    vocabulary_head=VocabularyHead(("cls.predictions.transform.LayerNorm.bias",), "embeddings.word_embeddings.weight"),
)

ROBERTA = Architecture(
    name="roberta",
    model_types=("roberta", "xlm-roberta", "camembert"),
    class_prefixes=("Roberta", "XLMRoberta", "Camembert"),
    prefixes=("roberta.", ""),
    stacks=(_BERT_LIKE_STACK,),
    description="RoBERTa (roberta-base, XLM-R, CamemBERT)",
    vocabulary_head=VocabularyHead(("lm_head.layer_norm.bias",), "embeddings.word_embeddings.weight"),
)

DISTILBERT = Architecture(
    name="distilbert",
    model_types=("distilbert",),
    class_prefixes=("DistilBert",),
    prefixes=("distilbert.", ""),
    stacks=(
        Stack(
            "encoder",
            ("n_layers", "num_hidden_layers"),
            (
                *_attention("transformer.layer.${layer}.attention.{}.weight", ("q_lin", "k_lin", "v_lin", "out_lin")),
                Tensor(template="transformer.layer.${layer}.ffn.lin1.weight", families=("ff1",)),
                Tensor(template="transformer.layer.${layer}.ffn.lin2.weight", families=("ff2",)),
            ),
        ),
    ),
    description="DistilBERT",
    vocabulary_head=VocabularyHead(("vocab_layer_norm.bias",), "embeddings.word_embeddings.weight"),
    shape_keys=(
        ("n_layers", "num_hidden_layers"),
        ("dim", "hidden_size"),
        ("hidden_dim", "intermediate_size"),
        ("n_heads", "num_attention_heads"),
    ),
)

T5 = Architecture(
    name="t5",
    model_types=("t5", "mt5"),
    class_prefixes=("T5", "MT5"),
    prefixes=("",),
    stacks=(
        _t5_stack("encoder", ("num_layers",), cross=False),
        _t5_stack("decoder", ("num_decoder_layers", "num_layers"), cross=True),
    ),
    description="T5 (t5-base: wi; v1.1/Flan-T5: gated wi_0/wi_1), encoder-decoder with cross-attention",
    shape_keys=(
        ("num_layers",),
        ("num_decoder_layers",),
        ("d_model",),
        ("d_ff",),
        ("num_heads",),
        ("d_kv",),
        ("feed_forward_proj",),
    ),
)

GPT2 = Architecture(
    name="gpt2",
    model_types=("gpt2",),
    class_prefixes=("GPT2",),
    prefixes=("transformer.", ""),
    stacks=(
        Stack(
            "decoder",
            ("n_layer", "num_hidden_layers"),
            (
                Tensor(
                    template="h.${layer}.attn.c_attn.weight",
                    families=ATTENTION[:3],
                    orientation=Orientation.CONV1D,
                    fused="qkv",
                ),
                Tensor(template="h.${layer}.attn.c_proj.weight", families=("o",), orientation=Orientation.CONV1D),
                Tensor(template="h.${layer}.mlp.c_fc.weight", families=("ff1",), orientation=Orientation.CONV1D),
                Tensor(template="h.${layer}.mlp.c_proj.weight", families=("ff2",), orientation=Orientation.CONV1D),
            ),
        ),
    ),
    description="GPT-2 (gpt2, gpt2-medium, distilgpt2): Conv1D [in,out], fused c_attn = q|k|v",
    vocabulary_head=VocabularyHead(("ln_f.bias",), "wte.weight", default=False),
    shape_keys=(
        ("n_layer", "num_hidden_layers"),
        ("n_embd", "hidden_size"),
        ("n_inner",),
        ("n_head", "num_attention_heads"),
    ),
)

_LLAMA_SHAPE = (
    ("num_hidden_layers",),
    ("hidden_size",),
    ("intermediate_size",),
    ("num_attention_heads",),
    ("num_key_value_heads",),
    ("head_dim",),
)

_LLAMA_LAYER = (
    *_attention("layers.${layer}.self_attn.{}.weight", ("q_proj", "k_proj", "v_proj", "o_proj")),
    Tensor(template="layers.${layer}.mlp.gate_proj.weight", families=("ff_gate",)),
    Tensor(template="layers.${layer}.mlp.up_proj.weight", families=("ff1",)),
    Tensor(template="layers.${layer}.mlp.down_proj.weight", families=("ff2",)),
)

LLAMA = Architecture(
    name="llama",
    model_types=("llama", "mistral", "qwen2", "qwen3"),
    class_prefixes=("Llama", "Mistral", "Qwen2", "Qwen3"),
    prefixes=("model.", ""),
    stacks=(Stack("decoder", ("num_hidden_layers",), _LLAMA_LAYER),),
    description="Llama family (llama, mistral, qwen2, qwen3): gated FFN, grouped-query attention",
    probe=32,  # deltas through the base's inputs on 32 probe tokens: the same-texts zoo's choice (docs/evidence.md)
    shape_keys=_LLAMA_SHAPE,
)

GEMMA = Architecture(
    name="gemma",
    model_types=("gemma", "gemma2"),
    class_prefixes=("Gemma", "Gemma2"),
    prefixes=("model.", ""),
    stacks=(Stack("decoder", ("num_hidden_layers",), _LLAMA_LAYER),),
    description="Gemma and Gemma 2: Llama's matrices (head_dim set apart from hidden_size), tied embeddings",
    shape_keys=_LLAMA_SHAPE,
)

PHI3 = Architecture(
    name="phi3",
    model_types=("phi3",),
    class_prefixes=("Phi3",),
    prefixes=("model.", ""),
    stacks=(
        Stack(
            "decoder",
            ("num_hidden_layers",),
            (
                Tensor(
                    template="layers.${layer}.self_attn.qkv_proj.weight",
                    families=ATTENTION[:3],
                    fused="qkv",
                    split=(
                        ("num_attention_heads",),
                        ("num_key_value_heads", "num_attention_heads"),
                        ("num_key_value_heads", "num_attention_heads"),
                    ),
                ),
                Tensor(template="layers.${layer}.self_attn.o_proj.weight", families=("o",)),
                Tensor(
                    template="layers.${layer}.mlp.gate_up_proj.weight", families=("ff_gate", "ff1"), fused="gate_up"
                ),
                Tensor(template="layers.${layer}.mlp.down_proj.weight", families=("ff2",)),
            ),
        ),
    ),
    description="Phi-3: fused qkv_proj (q | k | v by head counts) and gate_up_proj (gate | up)",
    shape_keys=_LLAMA_SHAPE,
)

ARCHITECTURES: dict[str, Architecture] = {a.name: a for a in (BERT, ROBERTA, DISTILBERT, T5, GPT2, LLAMA, GEMMA, PHI3)}


def supported() -> str:
    """The supported model types, for error messages."""
    return ", ".join(sorted(t for a in ARCHITECTURES.values() for t in a.model_types))


def detect(config: Mapping[str, Any] | None, model: str = "model", names: set[str] | None = None) -> Architecture:
    """The family of a model, from config.json's ``model_type`` (or ``architectures`` when it has none).

    Without a config (a bare weights file), the tensor names decide: the family whose first
    layer-0 tensor is present under one of its prefixes.
    """
    if config:
        model_type = str(config.get("model_type") or "").lower()
        if model_type:  # a known class name never rescues an unknown model_type (Qwen2Moe is not Qwen2)
            for arch in ARCHITECTURES.values():
                if model_type in arch.model_types:
                    return arch
        else:
            for cls in config.get("architectures") or []:
                for arch in ARCHITECTURES.values():
                    if re.fullmatch(
                        rf"({'|'.join(arch.class_prefixes)})(Model|LMHeadModel|For\w+|Encoder\w*)", str(cls)
                    ):
                        return arch
        seen = model_type or ",".join(map(str, config.get("architectures") or [])) or "none given"
        raise ArchitectureError(model, f"unknown architecture '{seen}'; supported model types: {supported()}")
    if names:
        for arch in ARCHITECTURES.values():
            first = arch.stacks[0].tensors[0].name(0)
            if any(p + first in names for p in arch.prefixes):
                return arch
    raise ArchitectureError(model, f"no config.json and no known tensor names; supported model types: {supported()}")
