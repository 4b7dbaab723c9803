"""Models per minute and peak memory of ``modelvec.embed`` beside the straightforward loop and the I/O floor.

Measured in one run, each configuration in its own fresh subprocess (so peak memory is its own):
the modelvec pipeline (fresh DuckDB store, per ``--workers``); the original study's loop written
plainly (``transformers.AutoModel.from_pretrained`` for base and each fine-tune, ``torch.svd_lowrank``
per matrix, no store writes); the I/O floor (read the used tensors of both checkpoints and subtract)
and the floor with the base held in memory. Per-model cost excludes start-up (base read, imports):
(t_last - t_first) / (n - 1) over the "embedded" callbacks. The scaling study runs the pipeline on
1, 10 and 100 models, where 100 models are N distinct fine-tunes hard-linked under 100 names so
they all fit in the page cache. Targets (bert-base-sized, warm page cache): >= 3x the loop,
within 1.25x of the floor, flat memory (peak RssAnon; total RSS also counts mapped file pages).

Run: ``make bench`` or ``python bench/bench_scale.py [--models 10] [--workers 1,2] [--scale 1,10,100]
[--skip-loop] [--skip-zoo] [--quick]``.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import torch
from bench_embed import CACHE, ROOT, base_in_memory, bert_base_pair, io_floor

import modelvec

OUT_JSON = CACHE / "bench_scale.json"
SCALE_DIR = CACHE / "scale"
CHUNK = 16 << 20
# The six matrices of a BERT layer, anchored after the layer index ("output.dense" is not "attention.output.dense").
_MATRIX = re.compile(
    r"encoder\.layer\.(\d+)\.(attention\.self\.query|attention\.self\.key|attention\.self\.value|"
    r"attention\.output\.dense|intermediate\.dense|output\.dense)\.weight$"
)


# ---------------------------------------------------------------- child side: one configuration, one process


class RssSampler(threading.Thread):
    """Peaks of VmRSS, RssAnon and RssFile (kB) from /proc/self/status, sampled every 50 ms."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak: dict[str, int] = {"VmRSS": 0, "RssAnon": 0, "RssFile": 0}
        self._stop_event = threading.Event()

    def sample(self) -> None:
        status = proc_status()
        for key in self.peak:
            self.peak[key] = max(self.peak[key], status.get(key, 0))

    def run(self) -> None:
        while not self._stop_event.wait(0.05):
            self.sample()

    def stop(self) -> dict[str, int]:
        self._stop_event.set()
        self.join()
        self.sample()
        return self.peak


def proc_status() -> dict[str, int]:
    """The kB fields of /proc/self/status."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if value.strip().endswith("kB"):
            fields[key] = int(value.split()[0])
    return fields


def run_modelvec(spec: dict, stamps: list[float]) -> dict:
    """``modelvec.embed`` into a fresh store, with only the keyword arguments this ``embed`` accepts."""
    named = {
        n
        for n, p in inspect.signature(modelvec.embed).parameters.items()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    }
    wanted = {"workers": spec["workers"], "load": False}
    kwargs = {k: v for k, v in wanted.items() if k in named}
    counts = {"embedded": 0, "skipped": 0, "failed": 0}
    failures: list[str] = []

    def progress(model: str, status: str, detail: str) -> None:
        counts[status] = counts.get(status, 0) + 1
        if status == "embedded":
            stamps.append(time.perf_counter())
        elif status == "failed":
            failures.append(detail)

    def on_step(step: Any) -> None:
        if step.status != "begin":
            progress(step.model, step.status, step.detail)

    said = {"on_step": on_step} if "on_step" in named else {"progress": progress}  # older versions: progress
    with tempfile.TemporaryDirectory() as tmp:
        modelvec.embed(spec["base"], spec["models"], store=Path(tmp) / "bench.duckdb", **said, **kwargs)
    return {
        "embed_kwargs": kwargs,
        "embed_kwargs_dropped": sorted(set(wanted) - set(kwargs)),
        **counts,
        "failures": failures[:3],
    }


def _file_tensor(folder: str, name: str) -> torch.Tensor:
    """The tensor ``name`` as stored in the folder's safetensors file (any prefix such as "bert.")."""
    from safetensors import safe_open

    with safe_open(str(Path(folder) / "model.safetensors"), "pt") as fh:
        key = next(k for k in fh.keys() if k == name or k.endswith("." + name))  # noqa: SIM118  (safe_open is not iterable)
        return fh.get_tensor(key)


def run_loop(spec: dict, stamps: list[float]) -> dict:
    """The original study's loop, written plainly: AutoModel per checkpoint, svd_lowrank per delta."""
    from transformers import AutoModel

    torch.set_grad_enabled(False)
    base = AutoModel.from_pretrained(spec["base"])
    base_w = {name: w for name, w in base.named_parameters() if _MATRIX.search(name)}
    dim = 0
    for i, path in enumerate(spec["models"]):
        ft, info = AutoModel.from_pretrained(path, output_loading_info=True)
        missing = [k for k in info["missing_keys"] if _MATRIX.search(k)]
        if missing:
            raise RuntimeError(f"{path}: AutoModel did not load {missing[:2]}... (re-initialised); the loop is invalid")
        layers: dict[int, list[torch.Tensor]] = {}
        for name, w in ft.named_parameters():
            match = _MATRIX.search(name)
            if not match:
                continue
            # the loaded weights must be the files' and differ from the base
            if (
                i == 0
                and not layers
                and (
                    not torch.equal(w, _file_tensor(path, name))
                    or not torch.equal(base_w[name], _file_tensor(spec["base"], name))
                    or torch.equal(w, base_w[name])
                )
            ):
                raise RuntimeError(f"{path}: {name} as loaded is not the file's, or equals the base's")
            delta = w - base_w[name]
            U, _S, _V = torch.svd_lowrank(delta.T, q=8)  # x @ W orientation: the transpose of nn.Linear's weight
            layers.setdefault(int(match.group(1)), []).append(U.flatten())
        vector = torch.stack([torch.cat(us) for us in layers.values()]).mean(0)
        dim = vector.numel()
        del ft
        stamps.append(time.perf_counter())
    return {"embedded": len(stamps), "dim": dim, "note": "no store writes"}


def run_floor(spec: dict, stamps: list[float]) -> dict:
    """io_floor per model (both checkpoints read), or with the base read once; mean after a warm-up pass."""
    start = time.perf_counter()
    base: Path | dict = Path(spec["base"])
    if spec["config"] == "floor_base_in_memory":
        base = base_in_memory(base)
    base_read_s = time.perf_counter() - start
    for m in spec["models"]:
        io_floor(base, Path(m))
    times = [io_floor(base, Path(m)) for m in spec["models"]]
    return {"per_model_s": sum(times) / len(times), "base_read_s": base_read_s, "embedded": len(times)}


RUNNERS: dict[str, Callable[[dict, list[float]], dict]] = {
    "modelvec": run_modelvec,
    "loop": run_loop,
    "floor": run_floor,
    "floor_base_in_memory": run_floor,
}


def child(spec: dict) -> None:
    """Run one configuration and print its results as one JSON line."""
    sampler = RssSampler()
    sampler.start()
    if spec["config"] == "loop":
        import transformers

        transformers.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
    stamps: list[float] = []
    start = time.perf_counter()
    result = RUNNERS[spec["config"]](spec, stamps)
    total = time.perf_counter() - start
    peak = sampler.stop()
    n = len(stamps)
    if "per_model_s" not in result:
        result["per_model_s"] = (stamps[-1] - stamps[0]) / (n - 1) if n > 1 else None
        result["first_model_s"] = stamps[0] - start if stamps else None
    result.update(
        config=spec["config"],
        workers=spec.get("workers"),
        models=len(spec["models"]),
        total_s=total,
        threads=torch.get_num_threads(),
        peak_rss_mb=peak["VmRSS"] / 1024,
        peak_rss_anon_mb=peak["RssAnon"] / 1024,
        peak_rss_file_mb=peak["RssFile"] / 1024,
        vm_hwm_mb=proc_status()["VmHWM"] / 1024,
        ru_maxrss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    )
    print(json.dumps(result))


# ---------------------------------------------------------------- parent side


def spawn(config: str, base: Path, models: list[Path], workers: int | None = None) -> dict:
    """One configuration in a fresh subprocess; its JSON line (or an error record)."""
    spec = {"config": config, "base": str(base), "models": [str(m) for m in models], "workers": workers}
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True, text=True, env=env
    )
    label = config + (f" (workers={workers})" if workers is not None else "")
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-3:]
        print(f"{label}: failed (exit {proc.returncode}): " + " | ".join(tail), file=sys.stderr)
        return {"config": config, "workers": workers, "models": len(models), "error": "\n".join(tail)}
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["process_s"] = time.perf_counter() - start
    if result.get("embedded") != len(models):
        print(
            f"{label}: {result.get('embedded')} of {len(models)} embedded ({result.get('failures') or ''})",
            file=sys.stderr,
        )
    print(f"{label}: {len(models)} models, {result['total_s']:.1f} s", file=sys.stderr)
    return result


def warm(paths: list[Path]) -> None:
    """Read every file of the folders once (16 MB chunks, each inode once): runs start with a warm page cache."""
    seen: set[tuple[int, int]] = set()
    buf = bytearray(CHUNK)
    for folder in paths:
        for file in sorted(p for p in folder.iterdir() if p.is_file()):
            st = file.stat()
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            with open(file, "rb", buffering=0) as fh:
                while fh.readinto(buf):
                    pass


def scale_models(distinct: list[Path], n: int) -> list[Path]:
    """``n`` folders under .cache/bench/scale/: hard links to the distinct fine-tunes in rotation (kept if right)."""
    out = []
    for i in range(n):
        src, dst = distinct[i % len(distinct)], SCALE_DIR / f"m{i:03d}"
        dst.mkdir(parents=True, exist_ok=True)
        for name in ("config.json", "model.safetensors"):
            target = dst / name
            if target.exists() and target.stat().st_ino == (src / name).stat().st_ino:
                continue
            target.unlink(missing_ok=True)
            os.link(src / name, target)
        out.append(dst)
    return out


def bench_set(label: str, base: Path, models: list[Path], workers: list[int], skip_loop: bool) -> dict:
    """All configurations over one model list, side by side."""
    print(f"== {label}: {len(models)} models", file=sys.stderr)
    warm([base, *models])
    rows = [spawn("floor", base, models), spawn("floor_base_in_memory", base, models)]
    rows += [spawn("modelvec", base, models, w) for w in workers]
    if not skip_loop:
        rows.append(spawn("loop", base, models))
    return {"label": label, "models": [str(m) for m in models], "rows": rows}


def fmt(value: float | None) -> str:
    """Three significant figures below 1, two decimals up to 100, whole numbers above."""
    if value is None:
        return "-"
    return f"{value:.3g}" if abs(value) < 1 else f"{value:.2f}" if abs(value) < 100 else f"{value:.0f}"


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def set_table(result: dict) -> str:
    """Markdown table of one model set, with the ratios to the loop and to both floors."""
    by = {r["config"]: r for r in result["rows"] if r["config"] != "modelvec"}
    loop_s, floor_s, bim_s = (by.get(k, {}).get("per_model_s") for k in ("loop", "floor", "floor_base_in_memory"))
    lines = [
        f"### {result['label']} ({len(result['models'])} models, per-model cost with start-up excluded)",
        "",
        "| configuration | total s | per-model s | models/min | x faster than loop | x floor "
        "| x floor (base in memory) | peak RSS MB | peak RssAnon MB |",
        "|" + "---|" * 9,
    ]
    for r in result["rows"]:
        name = r["config"] + (f" workers={r['workers']}" if r["config"] == "modelvec" else "")
        name += " (no store writes)" if r["config"] == "loop" else ""
        if "error" in r:
            lines.append(f"| {name} | failed: {r['error'].splitlines()[-1][:80]} |" + " |" * 7)
            continue
        s = r["per_model_s"]
        measured = r["config"] in ("modelvec", "loop")
        lines.append(
            " | ".join(
                [
                    f"| {name}",
                    fmt(r["total_s"]),
                    fmt(s),
                    fmt(60 / s if s else None),
                    fmt(_ratio(loop_s, s)) if r["config"] == "modelvec" else "",
                    fmt(_ratio(s, floor_s)) if measured else "",
                    fmt(_ratio(s, bim_s)) if measured else "",
                    f"{r['peak_rss_mb']:.0f}",
                    f"{r['peak_rss_anon_mb']:.0f} |",
                ]
            )
        )
    dropped = {k for r in result["rows"] for k in r.get("embed_kwargs_dropped", [])}
    if dropped:
        lines.append(
            f"\nnote: this modelvec.embed does not accept {', '.join(sorted(dropped))}; ran without them "
            "(the workers rows are then one configuration)"
        )
    return "\n".join(lines)


def scale_table(rows: list[dict], distinct: int, workers: int) -> str:
    lines = [
        f"### Scaling: modelvec workers={workers}; {rows[-1]['models'] if rows else 0} models = {distinct} "
        "distinct fine-tunes hard-linked under that many names (all in the page cache)",
        "",
        "| models | total s | per-model s | models/min | peak RSS MB | peak RssAnon MB | VmHWM MB | ru_maxrss MB |",
        "|" + "---|" * 8,
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['models']} | failed |" + " |" * 6)
            continue
        s = r["per_model_s"]
        lines.append(
            f"| {r['models']} | {fmt(r['total_s'])} | {fmt(s)} | {fmt(60 / s if s else None)} | "
            f"{r['peak_rss_mb']:.0f} | {r['peak_rss_anon_mb']:.0f} | {r['vm_hwm_mb']:.0f} | "
            f"{r['ru_maxrss_mb']:.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--models", type=int, default=10, help="distinct bert-base-sized fine-tunes (default 10)")
    parser.add_argument("--workers", default="1,2", help="modelvec I/O workers to compare (default 1,2)")
    parser.add_argument("--scale", default="1,10,100", help="model counts of the scaling study ('' to skip)")
    parser.add_argument("--zoo", type=Path, default=ROOT / ".cache" / "zoo")
    parser.add_argument("--skip-loop", action="store_true")
    parser.add_argument("--skip-zoo", action="store_true")
    parser.add_argument("--quick", action="store_true", help="smoke run: --models 3 --scale 1,3")
    args = parser.parse_args()
    if args.child:
        return child(json.loads(args.child))
    if args.quick:
        args.models, args.scale = 3, "1,3"
    workers = [int(w) for w in args.workers.split(",")]
    scale = [int(n) for n in args.scale.split(",") if n]
    env = {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        "python": sys.version.split()[0],
        "embed_params": list(inspect.signature(modelvec.embed).parameters),
    }
    print(f"torch {env['torch']}, {env['threads']} threads, {env['cpus']} CPUs", file=sys.stderr)
    results: dict[str, Any] = {"env": env, "args": vars(args), "sets": [], "scale": []}
    base, distinct = bert_base_pair(args.models)
    results["sets"].append(
        bench_set(
            f"bert-base-sized random (12x768, ff 3072), {len(distinct)} distinct fine-tunes",
            base,
            distinct,
            workers,
            args.skip_loop,
        )
    )
    manifest = args.zoo / "zoo.json"
    if args.skip_zoo:
        pass
    elif manifest.exists():
        zoo = json.loads(manifest.read_text())
        results["sets"].append(
            bench_set(
                "demo zoo (all-MiniLM-L6-v2 fine-tunes)",
                Path(zoo["base"]),
                [Path(m["path"]) for m in zoo["models"]],
                workers,
                args.skip_loop,
            )
        )
    else:
        print(f"no demo zoo at {manifest} (run `make demo`); zoo skipped", file=sys.stderr)
    if scale:
        models = scale_models(distinct, max(scale))
        n = max(scale)
        results["scale_note"] = f"{n} models = {len(distinct)} distinct fine-tunes hard-linked under {n} names"
        print(f"== scaling: {results['scale_note']}", file=sys.stderr)
        warm([base, *models])
        results["scale"] = [spawn("modelvec", base, models[:n], workers[-1]) for n in scale]
    OUT_JSON.parent.mkdir(parents=True, exist_ok=True)
    OUT_JSON.write_text(json.dumps(results, indent=1, default=str))
    print(
        f"torch {env['torch']}, {env['threads']} threads, {env['cpus']} CPUs; "
        f"embed accepts: {', '.join(env['embed_params'])}\n"
    )
    for s in results["sets"]:
        print(set_table(s) + "\n")
    print("targets (bert-base-sized, warm page cache): >= 3x faster than loop, <= 1.25x floor, flat peak RssAnon\n")
    if results["scale"]:
        print(scale_table(results["scale"], len(distinct), workers[-1]) + "\n")
    print(f"raw results: {OUT_JSON}")


if __name__ == "__main__":
    main()
