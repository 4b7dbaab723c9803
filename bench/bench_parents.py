"""Adapters on one fine-tune through ``embed``: how often the parent's rows are read, and the run's time (issue 42).

Makes a 6-layer BERT of width 768 (base, a fine-tune ``a``, 8 peft LoRA adapters trained on ``a``; 335 MB) under
``ROOT``, then embeds the 8 adapters three times. Compare two versions side by side in one session, on one machine:

    python bench/bench_parents.py /tmp/parents                                  # makes the models once
    PYTHONPATH=<old checkout>/src python bench/bench_parents.py /tmp/parents
    PYTHONPATH=src python bench/bench_parents.py /tmp/parents
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path


def make(root: Path) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=512, hidden_size=768, num_hidden_layers=6, num_attention_heads=12, intermediate_size=3072
    )
    model = BertModel(config)
    model.save_pretrained(root / "base")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 2 and ".layer." in name:
                p.add_(0.002 * torch.randn_like(p))
    model.save_pretrained(root / "a")
    for i in range(8):
        torch.manual_seed(100 + i)
        peft = get_peft_model(model, LoraConfig(init_lora_weights=False, r=4, target_modules=["query", "value"]))
        peft.save_pretrained(root / f"adapter-{i}")
        path = root / f"adapter-{i}" / "adapter_config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "base_model_name_or_path": str(root / "a")}))
        model = peft.unload()


def run(root: Path) -> dict:
    import modelvec
    from modelvec.represent import embedder

    reads: list[str] = []
    raw_blocks = embedder.DeltaEmbedder._raw_blocks

    def counted(self, ck):  # type: ignore[no-untyped-def]
        reads.append(ck.name)
        return raw_blocks(self, ck)

    embedder.DeltaEmbedder._raw_blocks = counted  # type: ignore[method-assign]
    adapters = [root / f"adapter-{i}" for i in range(8)]
    seconds = []
    for _ in range(3):
        reads.clear()
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            result = modelvec.embed(root / "base", adapters, store=Path(tmp) / "s.duckdb")
            seconds.append(round(time.perf_counter() - start, 3))
        assert not result.failed, result.failed
    return {"modelvec": modelvec.__file__, "seconds": seconds, "parent_reads": reads.count(str(root / "a"))}


if __name__ == "__main__":
    where = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/bench-parents")
    if not (where / "adapter-7").exists():
        where.mkdir(parents=True, exist_ok=True)
        make(where)
    print(json.dumps(run(where)))
