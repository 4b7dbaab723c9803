"""How GGUF files map onto modelvec's architecture entries: one declarative entry per GGUF architecture.

For :class:`~modelvec.read.gguf.GGUFCheckpoint`: which entry of :data:`~modelvec.read.architectures.ARCHITECTURES`
a file's ``general.architecture`` reads as, which GGUF metadata keys give the config.json values that entry needs, and
which values the metadata does not hold and the stored tensors tell instead. Data, like the architectures.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class _Stored:
    """A config.json value that the GGUF metadata does not hold, read off whether ``tensor`` is stored: ``value``
    when it is, ``otherwise`` when not."""

    key: str
    tensor: str
    value: str
    otherwise: str


@dataclass(frozen=True, kw_only=True)
class _Family:
    """How one GGUF ``general.architecture`` maps onto a modelvec architecture table.

    ``config`` maps the Hugging Face config.json keys the table needs to GGUF metadata keys
    (``{arch}`` is the GGUF architecture name); ``defaults`` gives a key's fallback key; ``stored``, the
    config values read off the tensors the file stores (T5's gated feed-forward: ffn_gate tensors or none).
    """

    table: str
    model_type: str
    config: dict[str, str]
    defaults: dict[str, str] = field(default_factory=dict)
    permuted_qk: bool = False
    stored: tuple[_Stored, ...] = ()


_LLM = {
    "num_hidden_layers": "{arch}.block_count",
    "hidden_size": "{arch}.embedding_length",
    "intermediate_size": "{arch}.feed_forward_length",
    "num_attention_heads": "{arch}.attention.head_count",
}
FAMILIES: dict[str, _Family] = {
    # llama.cpp's LlamaModel converter permutes the rows of q_proj and k_proj (see GGUFCheckpoint).
    "llama": _Family(
        table="llama",
        model_type="llama",
        config={**_LLM, "num_key_value_heads": "{arch}.attention.head_count_kv"},
        defaults={"num_key_value_heads": "num_attention_heads"},
        permuted_qk=True,
    ),
    "qwen2": _Family(
        table="llama",
        model_type="qwen2",
        config={**_LLM, "num_key_value_heads": "{arch}.attention.head_count_kv"},
        defaults={"num_key_value_heads": "num_attention_heads"},
    ),
    "gpt2": _Family(
        table="gpt2",
        model_type="gpt2",
        config={
            "n_layer": "{arch}.block_count",
            "n_embd": "{arch}.embedding_length",
            "n_inner": "{arch}.feed_forward_length",
            "n_head": "{arch}.attention.head_count",
        },
    ),
    "bert": _Family(table="bert", model_type="bert", config=dict(_LLM)),
    "t5": _Family(
        table="t5",
        model_type="t5",
        config={
            "num_layers": "{arch}.block_count",
            "num_decoder_layers": "{arch}.decoder_block_count",
            "d_model": "{arch}.embedding_length",
            "d_ff": "{arch}.feed_forward_length",
            "num_heads": "{arch}.attention.head_count",
        },
        defaults={"num_decoder_layers": "num_layers"},
        # gated (v1.1, Flan-T5) or not (t5-base): the metadata does not say, the encoder's ffn_gate tensors do
        stored=(
            _Stored(key="feed_forward_proj", tensor="enc.blk.0.ffn_gate.weight", value="gated-gelu", otherwise="relu"),
        ),
    ),
}
