"""Bytes a quantization on the Hub costs: the share of each quantized file that ``embed`` fetches, and its requests.

The base is SmolLM2-135M-Instruct dequantized from its packaged llama.cpp GGUF (``demo/build_llm_evidence.py``'s
base, built once). Its quantizations: that real GGUF itself (Q4_1, as llama.cpp wrote it), Q8_0, Q5_0 and Q4_0 GGUFs
(the gguf package's quantizers, written as llama.cpp's converter writes them, the vocabulary's tokens in the
header), GPTQ and AWQ 4-bit (group 64: SmolLM2's 576 inputs are 9 of them) and bitsandbytes nf4 (double
quantization) and int8 (packed as their quantizers pack them: :mod:`modelvec.testing.quantized`). Each is published
on a local Hub that serves byte ranges and counts what it sends, and embedded by Hub id with the defaults (the rows
of each matrix that the vector and the trace read).

Run: ``python bench/bench_quantized_bytes.py [--out .cache/bench-quantized]``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "demo"))

import build_llm_evidence as dec_ev  # noqa: E402  (sets HF_HUB_OFFLINE for transformers: undone below)
from huggingface_hub import constants  # noqa: E402

from modelvec import embed  # noqa: E402
from modelvec.hub.client import HubSettings  # noqa: E402
from modelvec.testing.gguf import Q, write_gguf  # noqa: E402
from modelvec.testing.localhub import LocalHub  # noqa: E402
from modelvec.testing.quantized import write_quantized  # noqa: E402


def packaged_gguf() -> Path:
    return dec_ev.package_dir(dec_ev.GGUF_PACKAGE) / dec_ev.GGUF_FILE


def sent(requests: list[dict], repo: str) -> tuple[dict[str, int], int]:
    """Bytes the Hub sent of each of ``repo``'s files, and the requests about the repository."""
    out: dict[str, int] = {}
    for r in requests:
        if r["method"] == "GET" and f"/{repo}/resolve/" in r["path"]:
            name = r["path"].rsplit("/", 1)[-1]
            m = re.fullmatch(r"bytes=(\d+)-(\d+)", r.get("range") or "")
            out[name] = out.get(name, 0) + (int(m.group(2)) - int(m.group(1)) + 1 if m else 10**15)
    return out, sum(1 for r in requests if f"/{repo}/" in r["path"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(".cache/bench-quantized"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    base = dec_ev.build_base(args.out)
    os.environ.pop("HF_HUB_OFFLINE", None)
    constants.HF_HUB_OFFLINE = False  # the local Hub is online
    work = args.out / "hub"
    shutil.rmtree(work, ignore_errors=True)
    q = args.out / "q"
    shutil.rmtree(q, ignore_errors=True)
    q.mkdir()
    made: dict[str, dict[str, Path]] = {"gguf-Q4_1 (llama.cpp's)": {"model-Q4_1.gguf": packaged_gguf()}}
    vocabulary = int(json.loads((base / "config.json").read_text())["vocab_size"])  # a header of megabytes, as real
    for qtype in (Q.Q8_0, Q.Q5_0, Q.Q4_0):
        name = f"model-{qtype.name}.gguf"
        made[f"gguf-{qtype.name}"] = {name: write_gguf(base, q / name, "llama", qtype, vocabulary=vocabulary)}
    for name, method, extra in (
        ("gptq-4bit", "gptq", {"bits": 4, "group": 64}),
        ("awq-4bit", "awq", {"group": 64}),
        ("bnb-nf4", "nf4", {"nested": True}),
        ("bnb-int8", "int8", {}),
    ):
        folder = write_quantized(base, q / name, method, **extra)
        made[name] = {p.name: p for p in folder.iterdir() if p.is_file()}
    hub = LocalHub(work)
    hub.publish("bench/base", base, link=True)
    repos = {}
    for name, files in made.items():
        repo = "bench/" + re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-")
        card = b"---\nbase_model: bench/base\nbase_model_relation: quantized\n---\n"
        hub.publish(repo, {**files, "README.md": card}, link=True)
        repos[name] = repo
    run = args.out / "run"  # a fresh cache and store each time: every byte is fetched anew
    shutil.rmtree(run, ignore_errors=True)
    with hub.serve() as srv:
        settings = HubSettings(endpoint=srv.endpoint, cache_dir=str(run / "cache"), token=False, retries=1)
        t0 = time.perf_counter()
        result = embed("bench/base", list(repos.values()), hub_settings=settings, store=run / "s.duckdb")
        seconds = time.perf_counter() - t0
        requests = list(srv.requests)
    print(
        f"| quantization | weight file | share of it fetched | requests | ({seconds:.0f} s, {len(result.failed)} failed)"
    )
    print("|---|---|---|---|")
    for name, repo in repos.items():
        got, asked = sent(requests, repo)
        weights = {n: p for n, p in made[name].items() if n.endswith((".gguf", ".safetensors"))}
        for file, path in weights.items():
            share = got.get(file, 0) / path.stat().st_size
            what = "whole" if share >= 1 else f"{share:.1%}"
            print(f"| {name} | {file} ({path.stat().st_size / 1e6:.0f} MB) | {what} | {asked} |")
    for model, error in result.failed.items():
        print(f"failed: {model}: {error}")


if __name__ == "__main__":
    main()
