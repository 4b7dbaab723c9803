"""The fixtures the representation's tests share: a family of derivatives of one tiny BERT (:func:`family`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file

from builders import int8_round_trip, perturb_layers, save_state, tiny_bert_config


def _bert():
    from transformers import BertModel

    return BertModel(
        tiny_bert_config(hidden_size=384, intermediate_size=768, vocab_size=64, max_position_embeddings=32)
    )


def _state(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


@pytest.fixture(scope="module")
def family(tmp_path_factory):
    """base; two fine-tunes a, b; an adapter trained on a (and a merged onto a); a merge 0.7 a + 0.3 b; an int8
    round trip of a; unrelated weights of the base's shapes. Rows of 384 and 768 values, as all-MiniLM-L6-v2's:
    longer than an int8 row's 255 levels."""
    root = tmp_path_factory.mktemp("trace")
    torch.manual_seed(0)
    model = _bert()
    model.save_pretrained(root / "base")
    perturb_layers(model, 1, 0.002)
    model.save_pretrained(root / "a")
    peft_model = get_peft_model(model, LoraConfig(init_lora_weights=False, r=4, target_modules=["query", "value"]))
    peft_model.save_pretrained(root / "adapter-on-a")
    config = root / "adapter-on-a" / "adapter_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "base_model_name_or_path": str(root / "a")}))
    peft_model.merge_and_unload().save_pretrained(root / "merged-on-a")
    torch.manual_seed(0)
    other = _bert()
    perturb_layers(other, 2, 0.002)
    other.save_pretrained(root / "b")
    a, b = _state(root / "a"), _state(root / "b")
    a_config = json.loads((root / "a" / "config.json").read_text())
    save_state(root / "merge", {k: 0.7 * a[k] + 0.3 * b[k] for k in a}, a_config)
    save_state(root / "a-int8", int8_round_trip(a), a_config)
    torch.manual_seed(7)
    _bert().save_pretrained(root / "unrelated")
    return root
