"""Decoder LLMs at 1-8B parameters: seconds per model, bytes read, the read floor and peak memory, per representation.

    python bench/bench_llm.py [--sizes 1b,3b,8b] [--reprs sketch,U,US,S,sketch-concat] [--device cpu|cuda]
    python bench/bench_llm.py --sizes 8b --reprs today,default --hub --bandwidth 1gbit [--no-rank]
    python bench/bench_llm.py --sizes 8b --hollow --fetch 4 --bandwidth 1gbit,10gbit [--fetch-models 2]

Writes Llama-shaped random sharded bf16 pairs itself (Llama-3.2-1B, Llama-3.2-3B and Llama-3.1-8B
dimensions, grouped-query attention; a small vocabulary, since embeddings are not read): a base,
and a fine-tune = base + a rank-16 delta + a small dense delta, rounded to bf16. Each measurement
runs in a fresh process that reports its wall time, peak anonymous memory (RssAnon, sampled every
5 ms: the kernel keeps no peak of it) and peak RSS (VmHWM, which also counts the mapped files'
pages). The read floor is measured the same way in the same run: every used matrix of both
checkpoints read as stored, converted to float32 and subtracted. The rank study of the fine-tune's
weights is timed against a plain float32 ``torch.linalg.svdvals`` loop over the same matrices.
Ratios are measured side by side; files are cached in ``--cache`` (about 2, 6 and 15 GB per model).

``--device cuda`` runs every job on the GPU. The floor there is every row of both checkpoints read,
moved to the GPU and subtracted there: the fine-tune's chunk copied into a float32 device buffer, the
base's chunk moved to the device as stored. CUDA is initialised before each job's clock starts (every
job would pay it alike) and synchronised before it stops. A job that fails (a device error, say) is
printed as one line and kept in ``--json`` as ``{"error": ...}``; the benchmark goes on, and ratios
to the floor are printed only when the floor has its seconds.
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


def write_pair(size: str, root: Path, device: str = "cpu") -> tuple[Path, Path]:
    """The base and fine-tune folders of one size (written once, then reused). The random weights are drawn on
    ``device``: a GPU draws an 8B pair in seconds where 16 CPU cores took 117 s (other numbers than the CPU's
    draw: each device's pair is its own)."""
    import torch
    from safetensors.torch import save_file

    layers, d, ff, heads, kv, hd = SIZES[size]
    base, ft = root / f"llama-{size}-base", root / f"llama-{size}-ft"
    if (ft / "model.safetensors.index.json").exists():
        return base, ft
    from hollow import llama_config

    config = llama_config(layers, d, ff, heads, kv, hd, vocab=256)
    shapes = {
        "self_attn.q_proj": (heads * hd, d),
        "self_attn.k_proj": (kv * hd, d),
        "self_attn.v_proj": (kv * hd, d),
        "self_attn.o_proj": (d, heads * hd),
        "mlp.gate_proj": (ff, d),
        "mlp.up_proj": (ff, d),
        "mlp.down_proj": (d, ff),
    }
    gen = torch.Generator(device=device).manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=device)

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

    emb = (randn(256, d) * 0.02).bfloat16().cpu()
    add(base, "model.embed_tokens.weight", emb)
    add(ft, "model.embed_tokens.weight", emb)
    for layer in range(layers):
        for name, (out, inp) in shapes.items():
            w = randn(out, inp) * 0.02
            delta = (randn(out, 16) @ randn(16, inp)) * (1e-3 / 16) + randn(out, inp) * 1e-4
            key = f"model.layers.{layer}.{name}.weight"
            add(base, key, w.bfloat16().cpu())
            add(ft, key, (w + delta).bfloat16().cpu())
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
gpu = device.startswith("cuda")
if gpu:  # the context and the allocator set up before the clock: every job would pay it alike
    torch.zeros(1, device=device); torch.cuda.synchronize()
idle = field("RssAnon:")
start = time.perf_counter()
if job == "floor":  # every used matrix of both, as stored -> float32 -> subtract: chunked into reused
    # cache-sized buffers, one matrix per thread (as fast as that work goes here, without any product);
    # on a GPU both chunks are moved there (larger chunks: no cache to fit) and subtracted there
    from concurrent.futures import ThreadPoolExecutor
    from modelvec.read import open_checkpoint
    a, b = open_checkpoint(ft), open_checkpoint(base)
    la, lb = a.layout(), b.layout()
    torch.set_num_threads(1)
    local = threading.local()
    chunk = (32 << 20) if gpu else (2 << 20)
    def one(ref):
        w, w0 = a.get_stored(la.prefix + ref.tensor), b.get_stored(lb.prefix + ref.tensor)  # as laid out in the file
        rows = max(1, chunk // (4 * w.shape[1]))
        buf = getattr(local, "buf", None)
        if buf is None or buf.shape[1] != w.shape[1] or buf.shape[0] < rows:
            buf = local.buf = torch.empty(rows, w.shape[1], device=device)
        s = torch.zeros((), device=device) if gpu else 0.0
        for i in range(0, w.shape[0], rows):
            d = buf[: min(rows, w.shape[0] - i)]
            if gpu:  # the fine-tune's chunk copied into the device buffer, the base's moved there as stored
                d.copy_(w[i : i + rows]); d.sub_(w0[i : i + rows].to(device))
                s += d[0, 0]  # on the device: no wait for each chunk
            else:
                d.copy_(w[i : i + rows]); d.sub_(w0[i : i + rows])
                s += float(d[0, 0])
        return float(s)
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
        ck = getattr(ck, "checkpoint", ck)  # an Opened (its read plan beside it) since issue 42
    got_s = time.perf_counter() - start - fit_s
    vec = e.embed_one(ck)
elif job == "hub-stream":  # several Hub fine-tunes through embed's pipeline: downloads overlap computation
    import modelvec
    from modelvec.hub.client import HubSettings
    hub = params.pop("_hub")
    settings = HubSettings(endpoint=hub["endpoint"], cache_dir=hub["cache"], token=False)
    result = modelvec.embed(base, hub["repos"], hub_settings=settings, store=hub["store"], workers=2, load=False, **params)
    assert not result.failed, result.failed
elif job == "hub-fetch":  # several Hub fine-tunes fetched as embed's I/O workers fetch them, nothing computed
    from concurrent.futures import ThreadPoolExecutor
    from modelvec import Representation
    from modelvec.hub.client import HubSettings
    from modelvec.run.work import open_hub
    hub = params.pop("_hub")
    settings = HubSettings(endpoint=hub["endpoint"], cache_dir=hub["cache"], token=False)
    representation = Representation(**params)
    cpu, fetch_start = time.process_time(), time.perf_counter()  # the imports above are not the fetch's
    with ThreadPoolExecutor(hub["models"]) as pool:
        list(pool.map(lambda repo: open_hub(repo, hub["shas"][repo], None, "ft", settings, representation, base=False), hub["repos"]))
    cpu = time.process_time() - cpu
elif job == "rank":
    from modelvec.studies.spectra import spectra_of
    spectra_of(ft, device=device, fused=False)
elif job == "svdvals":  # the first "matrices" of them (every family of whole layers), or all
    from modelvec.read import open_checkpoint
    a = open_checkpoint(ft)
    la = a.layout()
    refs = la.refs[: params.get("matrices") or len(la.refs)]
    for ref in refs:
        torch.linalg.svdvals(a.matrix(ref, la.prefix).to(device))
if gpu:
    torch.cuda.synchronize()
seconds = time.perf_counter() - start
done.set()
out = {"seconds": seconds, "peak_anon": max(peak[0], field("RssAnon:")) - idle, "peak_rss": field("VmHWM:")}
if job == "svdvals":
    out["matrices"], out["of"] = len(refs), len(la.refs)
if job == "hub-fetch":
    out["cpu_seconds"], out["fetch_seconds"] = cpu, seconds - (fetch_start - start)
if job in ("embed", "hub-embed", "hub-whole"):  # a stream's seconds are its whole run, the base fitted once
    out["fit_seconds"] = fit_s
    out["embed_seconds"] = seconds - fit_s
if job == "embed":
    out["bytes_needed"] = needed
    out["device"] = str(e.device)  # what auto took
if job in ("hub-embed", "hub-whole"):
    out["fetch_seconds"] = got_s
print(json.dumps(out))
"""


def measure(job: str, base: Path, ft: Path, params: dict | None = None, device: str = "cpu") -> dict:
    """One job in a fresh process (this checkout's src first on ``PYTHONPATH``): its figures, or ``{"error": why}``.

    Importable, so a test can run one job on tiny folders; a failure of the job (a device error, a
    missing folder) comes back as its last line of stderr rather than raising here.
    """
    paths = [str(Path(__file__).resolve().parents[1] / "src"), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    arg = json.dumps([job, str(base), str(ft), params or {}, device])
    done = subprocess.run([sys.executable, "-c", CHILD, arg], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]}
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"error": f"no figures in the job's output: {done.stdout.strip()[-200:]!r}"}


def failed(got: dict, what: str) -> bool:
    """Whether a job failed; if it did, one line says which and why (the benchmark goes on)."""
    if "error" in got:
        print(f"{what:>14}: failed: {got['error']}", flush=True)
    return "error" in got


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

    rate = parse_bandwidth(args.bandwidth.split(",")[0])
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


def write_hollow(size: str, root: Path) -> Path:
    """A fine-tune of ``size``'s shape whose tensors are holes (sparse files of their real sizes: they read as zeros
    and take no disk): what fetching byte ranges from a Hub costs depends on the layout alone, and an 8B pair would
    take 30 GB of disk. Tensors in shards of ``SHARD_BYTES``, each shard's header as safetensors writes it."""
    from hollow import llama_config, llama_tensors
    from hollow import write_hollow as write

    config = llama_config(*SIZES[size], vocab=256)
    folder = root / f"llama-{size}-hollow"
    write(folder, config, llama_tensors(config), SHARD_BYTES)
    return folder


def fetch_law(got: dict, rate: float, latency: float, in_flight: int) -> str:
    """The fetch against its limits: bytes / bandwidth (the link), requests x latency / requests in flight (round
    trips, if none overlapped a transfer), and the CPU both ends spent over the 2 cores; the share of the time the
    bytes took, the rest being requests (round trips, their setup, the client's and server's work)."""
    link, seconds = got["bytes_sent"] / rate, got["fetch_seconds"]
    trips = got["requests"] * latency / in_flight
    cpu = (got["cpu_seconds"] + got["server_cpu"]) / 2
    return (
        f"{seconds:6.1f} s = {seconds / link:.2f}x bytes/bandwidth ({link:.1f} s); "
        f"{got['requests']} requests x {latency * 1e3:.0f} ms / {in_flight} in flight = {trips:.1f} s, "
        f"limit max(link, trips) {max(link, trips):.1f} s, link + trips {link + trips:.1f} s; CPU (client "
        f"{got['cpu_seconds']:.1f} + server {got['server_cpu']:.1f} s) / 2 cores {cpu:.1f} s; bytes "
        f"{link / seconds:.0%} of the time, requests and the rest {1 - link / seconds:.0%}"
    )


def fetch_stream(size: str, ft: Path, args: argparse.Namespace) -> list[dict]:
    """``--fetch N`` copies of the fine-tune fetched from a local Hub as ``embed``'s I/O workers fetch them
    (``--fetch-models`` models in flight, each with its requests in flight), nothing computed: seconds against the
    link's floor, at each ``--bandwidth`` with ``--latency`` and side by side without it (what round trips cost)."""
    import shutil
    import tempfile

    from modelvec.hub.partial import IN_FLIGHT
    from modelvec.testing.localhub import LocalHub, parse_bandwidth

    root = Path(tempfile.mkdtemp(prefix="bench-fetch-", dir=args.cache))
    out = []
    try:
        hub = LocalHub(root / "hub")
        shas = {f"bench/ft-{i}": hub.publish(f"bench/ft-{i}", ft, link=True) for i in range(args.fetch)}
        in_flight = args.fetch_models * IN_FLIGHT
        models = f"{args.fetch_models} model{'s' if args.fetch_models > 1 else ''}"
        print(f"a stream of {args.fetch} fetched, {models} in flight, {IN_FLIGHT} requests each:")
        runs = [(parse_bandwidth(b), latency) for b in args.bandwidth.split(",") for latency in (args.latency, 0.0)]
        for rate, latency in [*runs, (None, 0.0)]:  # last, no link at all: what this machine's two ends can do
            with hub.serve(bandwidth=rate, latency=latency) as server:
                first, before, cpu = len(server.requests), server.bytes_sent(), time.process_time()
                hub_args = {"endpoint": server.endpoint, "repos": list(shas), "shas": shas}
                hub_args |= {"models": args.fetch_models, "cache": str(root / "cache")}
                got = measure("hub-fetch", ft, ft, {**REPRS["default"], "_hub": hub_args}, args.device)
                got |= {"server_cpu": time.process_time() - cpu, "requests": len(server.requests) - first}
                got |= {"bytes_sent": server.bytes_sent() - before}
            shutil.rmtree(root / "cache", ignore_errors=True)
            what = f"{'no limit' if rate is None else f'{rate * 8 / 1e9:g} Gbit/s'}, {latency * 1e3:.0f} ms"
            out.append({"size": size, "job": "hub-fetch", "bandwidth": rate, "latency": latency, **got})
            if failed(got, what):
                continue
            if rate is None:
                print(
                    f"{what:>18}: {got['fetch_seconds']:6.1f} s, {got['bytes_sent'] / got['fetch_seconds'] / 1e6:.0f} "
                    f"MB/s: the local Hub and the client on this machine's cores, the most any link here shows",
                    flush=True,
                )
            else:
                print(f"{what:>18}: {fetch_law(got, rate, latency, in_flight)}", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (``argv`` for a test; else ``sys.argv``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1b,3b,8b")
    parser.add_argument("--reprs", default=",".join(REPRS))
    parser.add_argument("--device", default="cpu", help="cpu or cuda (cuda:N): where every job runs, the floor too")
    parser.add_argument("--cache", type=Path, default=Path(".cache/llm"))
    parser.add_argument("--rank", action=argparse.BooleanOptionalAction, default=True, help="also time the rank study")
    parser.add_argument(
        "--svdvals-matrices",
        type=int,
        default=0,
        metavar="N",
        help="time the svdvals loop over the first N matrices (whole layers) and scale it (0: all)",
    )
    parser.add_argument("--json", type=Path, help="also write every figure here")
    parser.add_argument(
        "--devices",
        action="store_true",
        help="also embed each representation with --device cpu, auto and (where a GPU is visible) cuda, side by side",
    )
    parser.add_argument(
        "--hub", action="store_true", help="also fetch the fine-tune from a local Hub (loopback) with --bandwidth"
    )
    parser.add_argument(
        "--bandwidth", default="1gbit", help="the local Hub's simulated link (shared by all requests); --fetch: a list"
    )
    parser.add_argument("--latency", type=float, default=0.02, help="the local Hub's time to first byte, seconds")
    parser.add_argument(
        "--stream",
        type=int,
        default=0,
        metavar="N",
        help="with --hub: also embed N Hub copies of the fine-tune in one run",
    )
    parser.add_argument(
        "--fetch",
        type=int,
        default=0,
        metavar="N",
        help="with --hub: also fetch N Hub copies of the fine-tune, nothing computed, against the link's floor",
    )
    parser.add_argument("--fetch-models", type=int, default=2, help="--fetch: models in flight (embed's workers)")
    parser.add_argument(
        "--hollow",
        action="store_true",
        help="with --fetch: a fine-tune of holes (no disk, no base), and only the fetch is measured",
    )
    return parser.parse_args(argv)


def embed_line(name: str, got: dict, floor: dict, matrices: int) -> str:
    """One representation's figures; its ratio to the floor only where the floor was measured."""
    gib = 1 << 30
    ratio = f"{got['embed_seconds'] / floor['seconds']:.2f}x the floor; " if "seconds" in floor else ""
    return (
        f"{name:>14}: {got['embed_seconds']:6.1f} s/model ({ratio}fit {got['fit_seconds']:.1f} s), reads "
        f"{got['bytes_needed'] / matrices:.1%} of the matrices' bytes, peak anon {got['peak_anon'] / gib:.2f} GiB, "
        f"peak RSS {got['peak_rss'] / gib:.2f} GiB"
    )


def rank_jobs(size: str, base: Path, ft: Path, device: str, svdvals: int = 0) -> list[dict]:
    """The rank study against a plain float32 svdvals loop, each reported even when the other failed. ``svdvals``
    > 0 times the loop over that many matrices (whole layers) and scales it to all (8B on a GPU: minutes)."""
    ours = measure("rank", base, ft, device=device)
    rows = [{"size": size, "job": "rank", **ours}]
    plain = measure("svdvals", base, ft, {"matrices": svdvals}, device=device)
    rows.append({"size": size, "job": "svdvals", **plain})
    broken = [what for got, what in ((ours, "rank study"), (plain, "svdvals loop")) if failed(got, what)]
    if not broken:  # each failure printed above, the ratio only when both were measured
        loop = plain["seconds"] * plain["of"] / plain["matrices"]
        how = "" if plain["matrices"] == plain["of"] else f", {plain['matrices']} of {plain['of']} timed and scaled"
        print(
            f"rank study (exact, float64 Gram + eigvalsh): {ours['seconds']:.1f} s; float32 svdvals loop: "
            f"{loop:.1f} s{how} ({loop / ours['seconds']:.2f}x)",
            flush=True,
        )
    return rows


def one_size(size: str, base: Path, ft: Path, args: argparse.Namespace) -> list[dict]:
    """Every job on one pair: the floor, each representation, the Hub's, the rank study; a failed one is kept."""
    gib = 1 << 30
    measure("floor", base, ft, device=args.device)  # warm the page cache as far as it holds both
    floor = measure("floor", base, ft, device=args.device)
    if not failed(floor, "read floor"):
        print(f"read floor: {floor['seconds']:.1f} s, peak anon {floor['peak_anon'] / gib:.2f} GiB", flush=True)
    results = [{"size": size, "job": "floor", **floor}]
    matrices = matrix_bytes(ft)
    for name in args.reprs.split(","):
        got = measure("embed", base, ft, REPRS[name], args.device)
        results.append({"size": size, "job": "embed", "repr": name, **got})
        if not failed(got, name):
            print(embed_line(name, got, floor, matrices), flush=True)
    if args.devices:
        results += devices_side_by_side(size, base, ft, args.reprs.split(","))
    if args.hub:
        results += through_hub(size, base, ft, args)
    if args.fetch:
        results += fetch_stream(size, ft, args)
    if args.rank:
        results += rank_jobs(size, base, ft, args.device, args.svdvals_matrices)
    return results


def devices_side_by_side(size: str, base: Path, ft: Path, reprs: list[str]) -> list[dict]:
    """Each representation embedded on the CPU, with ``auto`` and on a visible GPU, one after the other (each a
    fresh process): seconds a model and the ratio to the CPU's, and which device ``auto`` took."""
    import torch

    devices = ["cpu", "auto"] + (["cuda"] if torch.cuda.is_available() else [])
    rows = []
    for name in reprs:
        got = {device: measure("embed", base, ft, REPRS[name], device) for device in devices}
        rows += [{"size": size, "job": "embed", "repr": name, "device": d, **g} for d, g in got.items()]
        cpu = got["cpu"].get("embed_seconds")
        said = []
        for device, figures in got.items():
            if failed(figures, f"{name} on {device}"):
                continue
            ratio = f" ({figures['embed_seconds'] / cpu:.2f}x the CPU's)" if cpu and device != "cpu" else ""
            picked = f", auto took {figures['device']}" if device == "auto" else ""
            said.append(f"{device} {figures['embed_seconds']:.2f} s{ratio}{picked}")
        print(f"{name:>14}: " + "; ".join(said), flush=True)
    return rows


def device_label(device: str) -> str:
    """The device as the header names it: a GPU's name too, so figures from different cards are not mixed."""
    if not device.startswith("cuda"):
        return device
    import torch

    return f"{device} ({torch.cuda.get_device_name(device)})" if torch.cuda.is_available() else device


def main(argv: list[str] | None = None) -> list[dict]:
    """Every size in turn; the figures (also written to ``--json``) returned for a caller."""
    args = parse_args(argv)
    results = []
    for size in args.sizes.split(","):
        start = time.perf_counter()
        if args.hollow:  # the fetch alone, of a fine-tune's layout
            print(f"\n== Llama {size} shape (bf16, sharded, hollow), fetched from a local Hub", flush=True)
            results += fetch_stream(size, write_hollow(size, args.cache), args)
            continue
        base, ft = write_pair(size, args.cache, args.device)
        print(
            f"\n== Llama {size} shape (bf16, sharded; written/reused in {time.perf_counter() - start:.0f} s), "
            f"on {device_label(args.device)}",
            flush=True,
        )
        results += one_size(size, base, ft, args)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
