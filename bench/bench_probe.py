"""The probe's cost (issue 48): the base's inputs H computed once per base, at Llama 1B, 3B and 8B shapes.

For each size a random bf16 Llama-shaped base is written once (sharded safetensors with its norms and a 128,256
token vocabulary, tied embeddings, a character tokenizer of as many ids), then, in a fresh process each,
:func:`modelvec.represent.probe.compute_inputs` runs it on the probe's first TOKENS tokens: seconds, peak RssAnon
(sampled every 20 ms: the weights are mapped from the page cache, the float32 layer and activations are not), peak
RSS, and the bytes of the kept file. The page cache is warmed first (a cold read of 16 GB adds the disk's time).

    python bench/bench_probe.py [--sizes 1b,3b,8b] [--tokens 32,128] [--root DIR] [--keep] [--embed 1b]

``--keep`` leaves the written bases (8B: 16 GB); by default each is deleted after its size is measured.
``--embed SIZE`` also writes a fine-tune of that size (the base plus a rank-16 delta and noise, as bench_llm's) and
times one embed with the default and with the probe (its H given), side by side, each in a fresh process, the files
in the page cache: the ratio is what the probe adds to a fine-tune's embed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_llm import SIZES
from hollow import llama_config, llama_tensors

VOCAB = 128_256
SHARD_BYTES = 2 << 30

CHILD = r"""
import json, sys, threading, time
peak = [0]
def watch():
    while True:
        with open('/proc/self/status') as f:
            for line in f:
                if line.startswith('RssAnon'):
                    peak[0] = max(peak[0], int(line.split()[1]) * 1024)
        time.sleep(0.02)
threading.Thread(target=watch, daemon=True).start()
import resource, torch
from pathlib import Path
from modelvec.read import open_checkpoint
from modelvec.represent.probe import compute_inputs
from modelvec.store.derived.inputs import write_inputs
folder, tokens, out = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
start = time.perf_counter()
layout = open_checkpoint(folder).layout()
inputs = compute_inputs(folder, layout, tokens, "base")
seconds = time.perf_counter() - start
write_inputs(out, {"bench": True}, inputs)
print(json.dumps({"seconds": seconds, "peak_anon": peak[0], "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "kept_bytes": out.stat().st_size, "threads": torch.get_num_threads()}))
"""


EMBED = r"""
import json, sys, time, torch
from modelvec import DeltaEmbedder
from modelvec.read import open_checkpoint
from modelvec.represent.probe import compute_inputs
base, ft, probe = sys.argv[1], sys.argv[2], sys.argv[3]
inputs = None
if probe != "none":
    inputs = compute_inputs(base, open_checkpoint(base).layout(), int(probe), "base")
    probe = int(probe)
start = time.perf_counter()
e = DeltaEmbedder(probe=probe).fit(base, inputs)
fit = time.perf_counter() - start
e.embed_one(ft)  # warm
start = time.perf_counter()
e.embed_one(ft)
print(json.dumps({"fit": fit, "embed": time.perf_counter() - start}))
"""


def write_finetune(size: str, base: Path) -> Path:
    """The base plus a rank-16 delta and noise in every projection (bench_llm's recipe), its other tensors shared."""
    import torch
    from safetensors.torch import load_file, save_file

    ft = base.with_name(base.name.replace("-base", "-ft"))
    if (ft / "model.safetensors.index.json").exists():
        return ft
    ft.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(1)
    for shard in sorted(base.glob("*.safetensors")):
        tensors = load_file(str(shard))
        for key, w in tensors.items():
            if w.ndim == 2 and ".layers." in key:
                out, inp = w.shape
                delta = torch.randn(out, 16, generator=gen) @ torch.randn(16, inp, generator=gen) * (1e-3 / 16)
                tensors[key] = (w.float() + delta + torch.randn(out, inp, generator=gen) * 1e-4).bfloat16()
        save_file(tensors, str(ft / shard.name))
    for name in ("model.safetensors.index.json", "config.json"):
        shutil.copy(base / name, ft / name)
    return ft


def embed_ratio(size: str, base: Path, tokens: int) -> dict:
    ft = write_finetune(size, base)
    warm(ft)
    got = {}
    for probe in ("none", str(tokens)):
        done = subprocess.run([sys.executable, "-c", EMBED, str(base), str(ft), probe], capture_output=True, text=True)
        if done.returncode:
            return {"error": (done.stderr.strip().splitlines() or ["failed"])[-1]}
        got[probe] = json.loads(done.stdout.strip().splitlines()[-1])
    ratio = got[str(tokens)]["embed"] / got["none"]["embed"]
    print(
        f"{size} embed of one fine-tune: default {got['none']['embed']:.2f}s, probe {tokens} "
        f"{got[str(tokens)]['embed']:.2f}s ({ratio:.2f}x); fit {got['none']['fit']:.2f}s vs "
        f"{got[str(tokens)]['fit']:.2f}s",
        flush=True,
    )
    shutil.rmtree(ft)
    return {"size": size, "embed": got, "ratio": ratio}


def write_base(size: str, root: Path) -> Path:
    """A random bf16 Llama base of ``size`` (norms, tied embeddings), written once."""
    import torch
    from safetensors.torch import save_file

    folder = root / f"llama-{size}-probe-base"
    if (folder / "model.safetensors.index.json").exists():
        return folder
    layers, d, ff, heads, kv, hd = SIZES[size]
    config = llama_config(layers, d, ff, heads, kv, hd, vocab=VOCAB, tie_word_embeddings=True, rms_norm_eps=1e-5)
    folder.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(0)
    shard: dict[str, torch.Tensor] = {}
    weight_map: dict[str, str] = {}

    def flush() -> None:
        name = f"model-{len(set(weight_map.values())) + 1:05d}.safetensors"
        save_file(shard, str(folder / name))
        weight_map.update(dict.fromkeys(shard, name))
        shard.clear()

    for name, shape in llama_tensors(config, norms=True):
        if len(shape) == 1:
            shard[name] = torch.ones(shape, dtype=torch.bfloat16)
        else:
            shard[name] = (torch.randn(*shape, generator=gen) * 0.02).bfloat16()
        if sum(t.numel() * 2 for t in shard.values()) >= SHARD_BYTES:
            flush()
    if shard:
        flush()
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (folder / "config.json").write_text(json.dumps(config))
    _tokenizer(folder)
    return folder


def _tokenizer(folder: Path) -> None:
    """A character-level tokenizer (the probe's characters, the rest unknown), as the tests' tiny models have."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from modelvec.represent.probe import probe_text

    table = {"[UNK]": 0, **{c: i + 1 for i, c in enumerate(sorted(set(probe_text())))}}
    tok = Tokenizer(models.WordLevel(table, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(folder)


def warm(folder: Path) -> None:
    for path in folder.glob("*.safetensors"):
        with open(path, "rb") as fh:
            while fh.read(64 << 20):
                pass


def measure(folder: Path, tokens: int, out: Path) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(folder), str(tokens), str(out)], capture_output=True, text=True
    )
    if done.returncode:
        return {"error": (done.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1b,3b,8b")
    ap.add_argument("--tokens", default="32,128")
    ap.add_argument("--root", type=Path, default=Path(".cache/bench-probe"))
    ap.add_argument("--keep", action="store_true", help="keep the written bases")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--embed", default="", help="sizes whose embed time is compared with and without the probe")
    args = ap.parse_args()
    results = []
    print(
        f"{'size':>4} {'tokens':>6} {'seconds':>8} {'peak RssAnon':>13} {'peak RSS':>9} {'kept':>8}  ({os.cpu_count()} CPUs)"
    )
    for size in args.sizes.split(","):
        folder = write_base(size, args.root)
        warm(folder)
        for tokens in (int(t) for t in args.tokens.split(",")):
            got = measure(folder, tokens, args.root / f"{size}-{tokens}.probe.kept")
            results.append({"size": size, "tokens": tokens, **got})
            if "error" in got:
                print(f"{size:>4} {tokens:>6} failed: {got['error']}")
                continue
            print(
                f"{size:>4} {tokens:>6} {got['seconds']:>7.1f}s {got['peak_anon'] / 2**30:>10.2f} GiB "
                f"{got['peak_rss'] / 2**30:>6.2f} GiB {got['kept_bytes'] / 1e6:>5.0f} MB",
                flush=True,
            )
        if size in args.embed.split(","):
            results.append(embed_ratio(size, folder, int(args.tokens.split(",")[0])))
        if not args.keep:
            shutil.rmtree(folder)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
