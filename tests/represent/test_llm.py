"""Decoder LLMs in bf16: vectors of bf16 checkpoints are those of their float32 upcasts, and memory is
bounded by a few matrices, not by the model (the base is never materialised in float32)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from builders import llama_pair as _llama_pair
from builders import save_state
from modelvec import DeltaEmbedder
from modelvec.read import Checkpoint


@pytest.mark.parametrize(
    "params",
    # the weights' own sketch (these checkpoints are matrices only: no model to run on the probe)
    [{"probe": "none"}, {"factor": "U", "solver": "exact"}, {"factor": "US", "pooling": "concat"}],
    ids=["sketch", "U", "US-concat"],
)
@pytest.mark.parametrize("batching", ["layer", "family"])
def test_bf16_checkpoints_give_the_vector_of_their_float32_upcasts(tmp_path, params, batching):
    base, ft = _llama_pair(tmp_path / "bf16", 64, 128, 2, torch.bfloat16)
    upcast = tmp_path / "f32"
    for name in ("base", "ft"):
        from safetensors.torch import load_file

        state = {
            k: v.float() for k, v in load_file(str((base if name == "base" else ft) / "model.safetensors")).items()
        }
        save_state(upcast / name, state, json.loads((base / "config.json").read_text()))
    a = DeltaEmbedder(**params, batching=batching).fit(base).embed_one(ft)
    b = DeltaEmbedder(**params, batching=batching).fit(upcast / "base").embed_one(upcast / "ft")
    assert np.abs(a).max() > 0
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


PEAK = textwrap.dedent("""
    import json, sys, threading, time
    def anon():
        return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("RssAnon:"))
    import torch
    from modelvec import DeltaEmbedder
    torch.set_num_threads(1)
    base, ft, params = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    e = DeltaEmbedder(**params, device="cpu")  # the CPU's memory (on a GPU machine "auto" would be CUDA's)
    e.embed_one  # warm imports and allocator before the baseline
    idle, peak, done = anon(), [0], threading.Event()
    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], anon()); time.sleep(0.002)
    threading.Thread(target=sample, daemon=True).start()
    e.fit(base); vec = e.embed_one(ft)
    done.set()
    print(json.dumps({"peak": max(peak[0], anon()) - idle}))
""")


@pytest.fixture(scope="module")
def large_pair(tmp_path_factory):
    """A Llama-shaped bf16 base and fine-tune of 8 layers of matrices up to 1024 x 4096 (~245 MB each as stored),
    written once for the module (and removed after it: ~0.5 GB): each test reads them in a process of its own."""
    root = tmp_path_factory.mktemp("large")
    yield _llama_pair(root, 1024, 4096, 8, torch.bfloat16)
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("params", [{"probe": "none"}, {"factor": "U"}], ids=["sketch", "U"])
def test_peak_anonymous_memory_is_a_few_matrices_not_the_model(large_pair, params):
    """8 layers of bf16 matrices up to 1024 x 4096 (8 MB bf16, 16 MB float32): the base alone is
    ~485 MB in float32 and ~245 MB as stored. Holding it (the old fit) or either model whole crosses the
    bound (10 of its largest matrices, 168 MB); a layer of deltas and the SVD's workspace (the U path, ~100 MB)
    stay under it."""
    base, ft = large_pair
    model_f32 = sum(os.path.getsize(p / "model.safetensors") for p in (base,)) * 2
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", PEAK, str(base), str(ft), json.dumps(params)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    peak = json.loads(out.stdout.strip().splitlines()[-1])["peak"]
    largest_f32 = 1024 * 4096 * 4
    assert model_f32 > 450e6 and 10 * largest_f32 < model_f32 / 2.5
    assert peak < 10 * largest_f32, f"peak anonymous memory {peak / 1e6:.0f} MB for a {model_f32 / 1e6:.0f} MB model"


def test_the_sketch_of_the_base_made_once_is_exact_to_float64(tmp_path):
    """(W_ft - W_base)·Ω computed as W_ft·Ω - W_base·Ω (the base's part at fit) in float64: within 1e-12 of
    the float64 definition on bf16 deltas, where a float32 product would be ~1e-7 from it."""
    from safetensors.torch import load_file

    from modelvec.represent.linalg import sketch_matrix

    base, ft = _llama_pair(tmp_path, 64, 256, 2, torch.bfloat16)
    e = DeltaEmbedder(rank=8, block_norm=False, pooling="concat", projection="shared", rows=1, device="cpu").fit(base)
    vec = e.embed_one(ft)
    b, f = load_file(str(base / "model.safetensors")), load_file(str(ft / "model.safetensors"))
    for ref, block in zip(e.layout_.refs, e.blocks_):
        key = "model." + ref.tensor
        delta = (f[key].double() - b[key].double()).T  # x @ W orientation
        omega = sketch_matrix(delta.shape[1], 8, 0).double()
        expected = (delta @ omega).T.reshape(-1).numpy()
        got = vec[block.start : block.stop].astype(np.float64)
        assert np.abs(got - expected).max() <= 1e-6 * np.abs(expected).max()  # float32 output rounding only
        ft_ck = Checkpoint(ft)
        internal = (e._project(ft_ck, ft_ck.layout(), ref)[0] - e.base_sketches_[ref.key]).numpy()  # before float32
        assert np.abs(internal - expected).max() <= 1e-12 * np.abs(expected).max()


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error where no GPU is visible")
def test_asking_for_cuda_without_a_gpu_is_one_line(tiny_bert, tmp_path):
    from typer.testing import CliRunner

    from modelvec.cli import app

    with pytest.raises(ValueError, match="no CUDA GPU is visible"):
        DeltaEmbedder(device="cuda")
    assert DeltaEmbedder(device="auto").device.type == "cpu"
    result = CliRunner().invoke(
        app,
        ["embed", "--base", str(tiny_bert), str(tiny_bert), "--device", "cuda", "--store", str(tmp_path / "s.duckdb")],
    )
    assert result.exit_code == 2 and "no CUDA GPU is visible" in result.output
    assert len(result.output.strip().splitlines()) == 1


#: Every kind of representation: the sketch's projections, a share of rows, pooling, block norm, each SVD
#: factor with each solver, and the GPU's per-layer batching.
DEVICE_CASES = {
    "default": {},
    "shared": {"projection": "shared", "rows": 1.0},
    "gaussian-rows0.25": {"projection": "gaussian", "rows": 0.25},
    "countsketch-concat": {"rows": 0.25, "pooling": "concat"},
    "no-block-norm": {"block_norm": False},
    "U": {"factor": "U"},
    "U-exact": {"factor": "U", "solver": "exact"},
    "US-concat": {"factor": "US", "pooling": "concat"},
    "S": {"factor": "S"},
    "U-by-layer": {"factor": "U", "batching": "layer"},
}


def assert_equal_to_float32_rounding(got: np.ndarray, want: np.ndarray) -> None:
    """Each entry within one float32 unit in the last place of the other's (both are float64 results rounded
    once), with a floor of 1e-12 of the largest entry for entries that cancel to near zero."""
    tol = np.spacing(np.abs(want).astype(np.float32)).astype(np.float64) + 1e-12 * np.abs(want).max()
    diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
    assert (diff <= tol).all(), f"{int((diff > tol).sum())} of {diff.size} entries differ, max {diff.max():.3g}"


@CUDA
@pytest.mark.parametrize("params", list(DEVICE_CASES.values()), ids=list(DEVICE_CASES))
def test_cuda_vectors_equal_cpu_vectors(tmp_path, params):
    base, ft = _llama_pair(tmp_path, 128, 256, 2, torch.bfloat16)
    cpu = DeltaEmbedder(**params, device="cpu").fit(base).embed_one(ft)
    gpu = DeltaEmbedder(**params, device="cuda").fit(base).embed_one(ft)
    assert np.abs(cpu).max() > 0
    assert_equal_to_float32_rounding(gpu, cpu)


@CUDA
def test_cuda_vector_with_the_vocabulary_head_equals_cpu_vector(tiny_bert, tiny_finetunes):
    cpu = DeltaEmbedder(device="cpu").fit(tiny_bert)
    gpu = DeltaEmbedder(device="cuda").fit(tiny_bert)
    assert cpu.vocabulary_ is not None  # the default's head on BERT
    assert_equal_to_float32_rounding(gpu.embed_one(tiny_finetunes[0]), cpu.embed_one(tiny_finetunes[0]))


@CUDA
def test_cuda_raw_signs_are_the_solvers_own_on_each_device(tmp_path):
    """sign='none' keeps the signs the solver returned, which LAPACK and cuSOLVER choose each their own way:
    the one setting whose vector depends on the device, equal up to each singular vector's sign."""
    base, ft = _llama_pair(tmp_path, 128, 256, 2, torch.bfloat16)
    params = {"factor": "U", "sign": "none", "pooling": "concat"}
    cpu = DeltaEmbedder(**params, device="cpu").fit(base).embed_one(ft)
    gpu = DeltaEmbedder(**params, device="cuda").fit(base).embed_one(ft)
    assert_equal_to_float32_rounding(np.abs(gpu), np.abs(cpu))


@CUDA
def test_cuda_ranks_equal_cpu_ranks(tmp_path):
    from modelvec.spectra import energy_rank_table as rank_table
    from modelvec.studies.depth import spectra_of as spectra

    base, ft = _llama_pair(tmp_path, 128, 256, 2, torch.bfloat16)
    thresholds = (0.5, 0.9, 0.99, 0.999)
    cpu = rank_table(spectra(ft, device="cpu"), thresholds)
    gpu = rank_table(spectra(ft, device="cuda"), thresholds)
    assert cpu["rank"].tolist() == gpu["rank"].tolist()
