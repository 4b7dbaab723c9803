"""Decoder LLMs at 1-8B parameters: seconds per model, bytes read, the read floor and peak memory, per representation.

    python bench/bench_llm.py [--sizes 1b,3b,8b] [--reprs sketch,U,US,S,sketch-concat] [--device cpu]
    python bench/bench_llm.py --sizes 8b --reprs today,default --hub --bandwidth 1gbit [--no-rank]

Writes Llama-shaped random sharded bf16 pairs itself (Llama-3.2-1B, Llama-3.2-3B and Llama-3.1-8B
dimensions, grouped-query attention; a small vocabulary, since embeddings are not read): a base,
and a fine-tune = base + a rank-16 delta + a small dense delta, rounded to bf16. Each measurement
runs in a fresh process that reports its wall time, peak anonymous memory (RssAnon, sampled every
5 ms: the kernel keeps no peak of it) and peak RSS (VmHWM, which also counts the mapped files'
pages). The read floor is measured the same way in the same run: every used matrix of both
checkpoints read as stored, converted to float32 and subtracted. The rank study of the fine-tune's
weights is timed against a plain float32 ``torch.linalg.svdvals`` loop over the same matrices.
Ratios are measured side by side; files are cached in ``--cache`` (about 2, 6 and 15 GB per model).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

SIZES = {  # layers, hidden, intermediate, heads, kv heads, head_dim
    "1b": (16, 2048, 8192, 32, 8, 64),
    "3b": (28, 3072, 8192, 24, 8, 128),
    "8b": (32, 4096, 14336, 32, 8, 128),
}
REPRS = {
    "default": {},  # Representation() as it is now
    "today": {"rank": 8, "projection": "shared", "rows": 1.0, "head": "none"},  # the default before a share of rows
    "rows0.05-cs": {"projection": "countsketch", "rows": 0.05},
    "rows0.05-gauss": {"projection": "gaussian", "rows": 0.05},
    "rows0.1-cs": {"projection": "countsketch", "rows": 0.1},
    "rows1-cs": {"projection": "countsketch", "rows": 1.0},
    "sketch": {"projection": "shared", "rows": 1.0},
    "sketch-r8": {"rank": 8, "projection": "shared", "rows": 1.0},
    "sketch-r16": {"rank": 16, "projection": "shared", "rows": 1.0},
    "sketch-r32": {"rank": 32, "projection": "shared", "rows": 1.0},
    "sketch-concat": {"pooling": "concat", "projection": "shared", "rows": 1.0},
    "U": {"factor": "U"},
    "US": {"factor": "US"},
    "S": {"factor": "S"},
}
SHARD_BYTES = 2 << 30


def write_pair(size: str, root: Path) -> tuple[Path, Path]:
    """The base and fine-tune folders of one size (written once, then reused)."""
    import torch
    from safetensors.torch import save_file

    layers, d, ff, heads, kv, hd = SIZES[size]
    base, ft = root / f"llama-{size}-base", root / f"llama-{size}-ft"
    if (ft / "model.safetensors.index.json").exists():
        return base, ft
    config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": d,
        "intermediate_size": ff,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": hd,
        "vocab_size": 256,
        "torch_dtype": "bfloat16",
    }
    shapes = {
        "self_attn.q_proj": (heads * hd, d),
        "self_attn.k_proj": (kv * hd, d),
        "self_attn.v_proj": (kv * hd, d),
        "self_attn.o_proj": (d, heads * hd),
        "mlp.gate_proj": (ff, d),
        "mlp.up_proj": (ff, d),
        "mlp.down_proj": (d, ff),
    }
    gen = torch.Generator().manual_seed(0)
    for folder in (base, ft):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(config))
    maps: dict[Path, dict[str, str]] = {base: {}, ft: {}}
    parts: dict[Path, dict[str, torch.Tensor]] = {base: {}, ft: {}}
    counts = {base: 0, ft: 0}

    def flush(folder: Path) -> None:
        if parts[folder]:
            name = f"model-{counts[folder] + 1:05d}.safetensors"
            save_file(parts[folder], str(folder / name))
            maps[folder].update({k: name for k in parts[folder]})
            parts[folder], counts[folder] = {}, counts[folder] + 1

    def add(folder: Path, key: str, tensor: torch.Tensor) -> None:
        parts[folder][key] = tensor.contiguous()
        if sum(t.numel() * 2 for t in parts[folder].values()) >= SHARD_BYTES:
            flush(folder)

    emb = (torch.randn(256, d, generator=gen) * 0.02).bfloat16()
    add(base, "model.embed_tokens.weight", emb)
    add(ft, "model.embed_tokens.weight", emb)
    for layer in range(layers):
        for name, (out, inp) in shapes.items():
            w = torch.randn(out, inp, generator=gen) * 0.02
            left, right = torch.randn(out, 16, generator=gen), torch.randn(16, inp, generator=gen)
            delta = (left @ right) * (1e-3 / 16) + torch.randn(out, inp, generator=gen) * 1e-4
            key = f"model.layers.{layer}.{name}.weight"
            add(base, key, w.bfloat16())
            add(ft, key, (w + delta).bfloat16())
    for folder in (base, ft):
        flush(folder)
        index = {"metadata": {}, "weight_map": maps[folder]}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return base, ft


# --- one measurement per fresh process -----------------------------------------------------------------

CHILD = r"""
import json, sys, threading, time
def field(name):
    for line in open("/proc/self/status"):
        if line.startswith(name):
            return int(line.split()[1]) * 1024
    return 0
peak = [0]
done = threading.Event()
def sample():
    while not done.is_set():
        peak[0] = max(peak[0], field("RssAnon:"))
        time.sleep(0.005)
threading.Thread(target=sample, daemon=True).start()
import torch
job, base, ft, params, device = json.loads(sys.argv[1])
idle = field("RssAnon:")
start = time.perf_counter()
if job == "floor":  # every used matrix of both, as stored -> float32 -> subtract: chunked into reused
    # cache-sized buffers, one matrix per thread (as fast as that work goes here, without any product)
    from concurrent.futures import ThreadPoolExecutor
    from modelvec.read import open_checkpoint
    a, b = open_checkpoint(ft), open_checkpoint(base)
    la, lb = a.layout(), b.layout()
    torch.set_num_threads(1)
    local = threading.local()
    def one(ref):
        w, w0 = a.get_stored(la.prefix + ref.tensor), b.get_stored(lb.prefix + ref.tensor)  # as laid out in the file
        rows = max(1, (2 << 20) // (4 * w.shape[1]))
        buf = getattr(local, "buf", None)
        if buf is None or buf.shape[1] != w.shape[1] or buf.shape[0] < rows:
            buf = local.buf = torch.empty(rows, w.shape[1], device=device)
        s = 0.0
        for i in range(0, w.shape[0], rows):
            d = buf[: min(rows, w.shape[0] - i)]
            d.copy_(w[i : i + rows]); d.sub_(w0[i : i + rows])
            s += float(d[0, 0])
        return s
    with ThreadPoolExecutor(2) as pool:
        total = sum(pool.map(one, la.refs))
elif job == "embed":
    from modelvec import DeltaEmbedder
    from modelvec.read import open_checkpoint
    from modelvec.represent import read_plan
    e = DeltaEmbedder(**params, device=device).fit(base)
    fit_s = time.perf_counter() - start
    vec = e.embed_one(ft)
    ck = open_checkpoint(ft)
    needed = sum(b - a for spans in ck.byte_ranges(read_plan(ck, e.representation, base=False)).values() for a, b in spans)
elif job in ("hub-embed", "hub-whole"):  # the fine-tune from the local Hub (endpoint in params), the base local
    from modelvec import DeltaEmbedder
    from modelvec.hub.client import HubSettings
    from modelvec.hub.download import fetch
    from modelvec.read import open_checkpoint
    from modelvec.run.work import open_hub
    hub = params.pop("_hub")
    settings = HubSettings(endpoint=hub["endpoint"], cache_dir=hub["cache"], token=False)
    e = DeltaEmbedder(**params, device=device).fit(base)
    fit_s = time.perf_counter() - start
    if job == "hub-whole":  # the whole files downloaded (what reading every row costs), then embedded
        ck = open_checkpoint(fetch(hub["repo"], hub["sha"], None, settings))
    else:
        ck = open_hub(hub["repo"], hub["sha"], None, "ft", settings, e.representation, base=False)
    got_s = time.perf_counter() - start - fit_s
    vec = e.embed_one(ck)
elif job == "hub-stream":  # several Hub fine-tunes through embed's pipeline: downloads overlap computation
    import modelvec
    from modelvec.hub.client import HubSettings
    hub = params.pop("_hub")
    settings = HubSettings(endpoint=hub["endpoint"], cache_dir=hub["cache"], token=False)
    result = modelvec.embed(base, hub["repos"], settings=settings, store=hub["store"], workers=2, load=False, **params)
    assert not result.failed, result.failed
elif job == "rank":
    from modelvec.studies.depth import spectra_of
    spectra_of(ft, device=device, fused=False)
elif job == "svdvals":
    from modelvec.read import open_checkpoint
    a = open_checkpoint(ft)
    la = a.layout()
    for ref in la.refs:
        torch.linalg.svdvals(a.matrix(ref, la.prefix).to(device))
if device.startswith("cuda"):
    torch.cuda.synchronize()
seconds = time.perf_counter() - start
done.set()
out = {"seconds": seconds, "peak_anon": max(peak[0], field("RssAnon:")) - idle, "peak_rss": field("VmHWM:")}
if job in ("embed", "hub-embed", "hub-whole"):  # a stream's seconds are its whole run, the base fitted once
    out["fit_seconds"] = fit_s
    out["embed_seconds"] = seconds - fit_s
if job == "embed":
    out["bytes_needed"] = needed
if job in ("hub-embed", "hub-whole"):
    out["fetch_seconds"] = got_s
print(json.dumps(out))
"""


def measure(job: str, base: Path, ft: Path, params: dict | None = None, device: str = "cpu") -> dict:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    arg = json.dumps([job, str(base), str(ft), params or {}, device])
    done = subprocess.run([sys.executable, "-c", CHILD, arg], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def reads_a_share(name: str) -> bool:
    """Whether the representation ``name`` reads a share of the rows (so byte ranges from a Hub), as built."""
    from modelvec import Representation

    return Representation(**REPRS[name]).reads_share


def matrix_bytes(folder: Path) -> int:
    """The bytes of the matrices a vector reads, whole (every layer matrix of the checkpoint)."""
    from modelvec.read import open_checkpoint

    ck = open_checkpoint(folder)
    layout = ck.layout()
    names = {layout.prefix + ref.tensor for ref in layout.refs}
    return sum(b - a for spans in ck.byte_ranges({n: [(0, ck.shape(n)[0])] for n in names}).values() for a, b in spans)


def through_hub(size: str, base: Path, ft: Path, args: argparse.Namespace) -> list[dict]:
    """The fine-tune fetched from a local Hub over loopback at ``--bandwidth``: the whole files (today's default
    needs every row) against each representation's byte ranges; seconds and the bytes the Hub sent, side by side."""
    import shutil
    import tempfile

    from modelvec.testing.localhub import LocalHub, parse_bandwidth

    rate = parse_bandwidth(args.bandwidth)
    root = Path(tempfile.mkdtemp(prefix="bench-hub-", dir=args.cache))
    out = []
    try:
        hub = LocalHub(root / "hub")
        sha = hub.publish("bench/ft", ft, link=True)  # hard links: no copy of the weights
        matrices = matrix_bytes(ft)
        print(
            f"through a local Hub at {args.bandwidth} ({rate / 1e6:.0f} MB/s), {args.latency * 1e3:.0f} ms to first byte:"
        )
        with hub.serve(bandwidth=rate, latency=args.latency) as server:
            jobs = [("hub-whole", "today", REPRS["today"])] + [
                ("hub-embed", name, REPRS[name]) for name in args.reprs.split(",") if reads_a_share(name)
            ]

            def through(job: str, name: str, params: dict, hub_args: dict) -> dict:
                """One measurement with a fresh Hub cache: its figures and the bytes the Hub sent for it."""
                cache = root / f"cache-{job}-{name}"
                before = server.bytes_sent()
                got = measure(job, base, ft, {**params, "_hub": {**hub_args, "cache": str(cache)}}, args.device)
                got["bytes_sent"] = server.bytes_sent() - before
                shutil.rmtree(cache, ignore_errors=True)
                out.append({"size": size, "job": job, "repr": name, **got})
                if "error" in got:
                    print(f"{name:>14}: {job} failed: {got['error']}", flush=True)
                return out[-1]  # the record itself: what is added to it is in the results too

            for job, name, params in jobs:
                got = through(job, name, params, {"endpoint": server.endpoint, "repo": "bench/ft", "sha": sha})
                if "error" in got:
                    continue
                what = "whole files, then embedded" if job == "hub-whole" else "its byte ranges"
                print(
                    f"{name:>14}: {got['embed_seconds']:6.1f} s/model ({what}; fetch {got['fetch_seconds']:.1f} s), "
                    f"{got['bytes_sent'] / 1e9:.2f} GB from the Hub ({got['bytes_sent'] / matrices:.1%} of the matrices)",
                    flush=True,
                )
            if args.stream > 1:  # the same fine-tune under N names, embedded as a user's run embeds them
                repos = []
                for i in range(args.stream):
                    repos.append(f"bench/ft-{i}")
                    hub.publish(repos[-1], ft, link=True)
                for name in [n for n in args.reprs.split(",") if reads_a_share(n)]:
                    store = str(root / f"stream-{name}.duckdb")
                    got = through(
                        "hub-stream", name, REPRS[name], {"endpoint": server.endpoint, "repos": repos, "store": store}
                    )
                    if "error" in got:
                        continue
                    got["per_model"] = got["seconds"] / args.stream
                    print(
                        f"{name:>14}: {got['per_model']:6.1f} s/model in a stream of {args.stream} (embed, 2 workers; "
                        f"base fitted once), {got['bytes_sent'] / 1e9 / args.stream:.2f} GB per model from the Hub",
                        flush=True,
                    )
        whole = next((r for r in out if r["job"] == "hub-whole" and "error" not in r), None)
        for r in out:
            if whole is not None and r["job"] == "hub-embed" and "error" not in r:
                print(
                    f"{r['repr']:>14}: {whole['embed_seconds'] / r['embed_seconds']:.1f}x faster than the whole files"
                )
            if whole is not None and r["job"] == "hub-stream" and "error" not in r:
                print(
                    f"{r['repr']:>14}: in a stream {whole['fetch_seconds'] / r['per_model']:.1f}x faster than the "
                    "whole files' download alone (what a stream of whole files costs per model, at least)"
                )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1b,3b,8b")
    parser.add_argument("--reprs", default=",".join(REPRS))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--cache", type=Path, default=Path(".cache/llm"))
    parser.add_argument("--rank", action=argparse.BooleanOptionalAction, default=True, help="also time the rank study")
    parser.add_argument("--json", type=Path, help="also write every figure here")
    parser.add_argument(
        "--hub", action="store_true", help="also fetch the fine-tune from a local Hub (loopback) with --bandwidth"
    )
    parser.add_argument("--bandwidth", default="1gbit", help="the local Hub's simulated link (shared by all requests)")
    parser.add_argument("--latency", type=float, default=0.02, help="the local Hub's time to first byte, seconds")
    parser.add_argument(
        "--stream",
        type=int,
        default=0,
        metavar="N",
        help="with --hub: also embed N Hub copies of the fine-tune in one run",
    )
    args = parser.parse_args()
    gib = 1 << 30
    results = []
    for size in args.sizes.split(","):
        start = time.perf_counter()
        base, ft = write_pair(size, args.cache)
        print(
            f"\n== Llama {size} shape (bf16, sharded; written/reused in {time.perf_counter() - start:.0f} s)",
            flush=True,
        )
        measure("floor", base, ft, device=args.device)  # warm the page cache as far as it holds both
        floor = measure("floor", base, ft, device=args.device)
        print(
            f"read floor: {floor.get('seconds', float('nan')):.1f} s, peak anon {floor.get('peak_anon', 0) / gib:.2f} GiB",
            flush=True,
        )
        results.append({"size": size, "job": "floor", **floor})
        matrices = matrix_bytes(ft)
        for name in args.reprs.split(","):
            got = measure("embed", base, ft, REPRS[name], args.device)
            results.append({"size": size, "job": "embed", "repr": name, **got})
            if "error" in got:
                print(f"{name:>14}: failed: {got['error']}", flush=True)
                continue
            print(
                f"{name:>14}: {got['embed_seconds']:6.1f} s/model ({got['embed_seconds'] / floor['seconds']:.2f}x the "
                f"floor; fit {got['fit_seconds']:.1f} s), reads {got['bytes_needed'] / matrices:.1%} of the matrices' "
                f"bytes, peak anon {got['peak_anon'] / gib:.2f} GiB, peak RSS {got['peak_rss'] / gib:.2f} GiB",
                flush=True,
            )
        if args.hub:
            results += through_hub(size, base, ft, args)
        if args.rank:
            ours, plain = (
                measure("rank", base, ft, device=args.device),
                measure("svdvals", base, ft, device=args.device),
            )
            results += [{"size": size, "job": "rank", **ours}, {"size": size, "job": "svdvals", **plain}]
            if "error" not in ours and "error" not in plain:
                print(
                    f"rank study (exact, float64 Gram + eigvalsh): {ours['seconds']:.1f} s; float32 svdvals loop: "
                    f"{plain['seconds']:.1f} s ({plain['seconds'] / ours['seconds']:.2f}x)",
                    flush=True,
                )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
