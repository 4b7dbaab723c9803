"""The benchmarks' jobs on a tiny Llama pair: on the GPU (skipped without one) and on the CPU.

bench_llm runs each job in a fresh process (``measure``), so these run the very code the benchmark
times, on folders of a few hundred kB instead of an 8B model.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest
import torch

from builders import llama_pair

BENCH = Path(__file__).resolve().parents[2] / "bench"
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
JOBS = [("floor", None), ("embed", "default"), ("embed", "U"), ("rank", None), ("svdvals", None)]


@pytest.fixture
def bench_llm(monkeypatch) -> ModuleType:
    """bench/bench_llm.py, imported from the repository's bench folder."""
    monkeypatch.syspath_prepend(str(BENCH))
    import bench_llm

    return bench_llm


@pytest.fixture
def bench_rank(monkeypatch) -> ModuleType:
    """bench/bench_rank.py, imported from the repository's bench folder."""
    monkeypatch.syspath_prepend(str(BENCH))
    import bench_rank

    return bench_rank


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny Llama-shaped bf16 base and fine-tune."""
    return llama_pair(tmp_path_factory.mktemp("llama"), 64, 128, 2, torch.bfloat16)


def run_job(bench_llm: ModuleType, pair: tuple[Path, Path], job: str, repr_name: str | None, device: str) -> dict:
    """One job of the benchmark, its figures checked to be a measurement, not an error."""
    params = bench_llm.REPRS[repr_name] if repr_name else None
    got = bench_llm.measure(job, *pair, params, device=device)
    assert "error" not in got, got["error"]
    assert got["seconds"] > 0
    if job == "embed":
        assert got["embed_seconds"] >= 0 and got["bytes_needed"] > 0
    return got


@cuda
@pytest.mark.parametrize(("job", "repr_name"), JOBS, ids=[f"{j}-{r}" if r else j for j, r in JOBS])
def test_each_job_runs_on_cuda(bench_llm, pair, job, repr_name) -> None:
    run_job(bench_llm, pair, job, repr_name, "cuda")


@cuda
def test_the_benchmark_on_cuda_measures_the_floor_and_every_job(bench_llm, pair, monkeypatch, tmp_path, capsys) -> None:
    monkeypatch.setattr(bench_llm, "write_pair", lambda size, root, device="cpu": pair)
    out = tmp_path / "results.json"
    bench_llm.main(["--sizes", "1b", "--reprs", "default,U", "--device", "cuda", "--json", str(out)])
    results = json.loads(out.read_text())
    assert [r["job"] for r in results] == ["floor", "embed", "embed", "rank", "svdvals"]
    assert all("seconds" in r and "error" not in r for r in results), results
    printed = capsys.readouterr().out
    assert "read floor:" in printed and "x the floor" in printed and "failed" not in printed


@cuda
def test_the_rank_benchmark_on_cuda(bench_rank, tiny_bert) -> None:
    row = bench_rank.bench("tiny-bert", tiny_bert, 1, False, False, device="cuda")
    assert not [k for k in row if k.endswith("error")], row
    assert row["modelvec_s"] > 0 and row["straightforward_s"] > 0
    assert row["device_name"] == torch.cuda.get_device_name()
    assert row["mismatches_vs_float64"] == 0


@pytest.mark.parametrize("job", ["floor", "rank"])
def test_floor_and_rank_run_on_the_cpu(bench_llm, pair, job) -> None:
    run_job(bench_llm, pair, job, None, "cpu")


def test_a_failing_job_is_reported_not_raised(bench_llm, tmp_path) -> None:
    got = bench_llm.measure("floor", tmp_path / "no-base", tmp_path / "no-ft")
    assert set(got) == {"error"} and "no-" in got["error"]


def test_the_benchmark_goes_on_when_the_floor_fails(bench_llm, pair, monkeypatch, tmp_path, capsys) -> None:
    """A device failure in the floor is one printed line and a recorded error: no KeyError, no ratio to it."""
    figures = {"seconds": 2.0, "peak_anon": 0, "peak_rss": 0}
    embed = {**figures, "fit_seconds": 1.0, "embed_seconds": 1.0, "bytes_needed": 1}

    def fake(job: str, base: Path, ft: Path, params: dict | None = None, device: str = "cpu") -> dict:
        if job == "floor":
            return {"error": "RuntimeError: Expected all tensors to be on the same device"}
        if job == "svdvals":
            return {"error": "torch.OutOfMemoryError: CUDA out of memory"}
        return embed if job == "embed" else figures

    monkeypatch.setattr(bench_llm, "write_pair", lambda size, root, device="cpu": pair)
    monkeypatch.setattr(bench_llm, "measure", fake)
    out = tmp_path / "results.json"
    results = bench_llm.main(["--sizes", "1b", "--reprs", "default", "--device", "cuda", "--json", str(out)])
    assert json.loads(out.read_text()) == results
    assert [r["job"] for r in results] == ["floor", "embed", "rank", "svdvals"]
    assert [("error" in r) for r in results] == [True, False, False, True]
    printed = capsys.readouterr().out
    assert "read floor: failed: RuntimeError: Expected all tensors" in printed
    assert "svdvals loop: failed: torch.OutOfMemoryError" in printed
    assert "default:    1.0 s/model (fit 1.0 s)" in printed  # no ratio to a floor that has no seconds


def test_a_failing_method_is_kept_in_its_row(bench_rank, tiny_bert, monkeypatch) -> None:
    def broken(folder: Path, device: str = "cpu") -> None:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(bench_rank, "modelvec", broken)
    row = bench_rank.bench("tiny-bert", tiny_bert, 1, False, False)
    assert row["modelvec_error"].startswith("RuntimeError: CUDA error")
    assert row["straightforward_s"] > 0 and "straightforward / modelvec" not in row


def test_the_fetch_stream_of_a_hollow_checkpoint_runs_on_the_cpu(bench_llm, monkeypatch, tmp_path, capsys) -> None:
    """``--hollow --fetch``: a sharded fine-tune of holes, fetched from the local Hub as embed's workers fetch, at a
    link, with and without latency and without a link, each run sent the same bytes, and the law printed."""
    monkeypatch.setitem(bench_llm.SIZES, "tiny", (2, 64, 128, 4, 2, 16))
    monkeypatch.setattr(bench_llm, "SHARD_BYTES", 40_000)
    ft = bench_llm.write_hollow("tiny", tmp_path)
    assert len(list(ft.glob("*.safetensors"))) > 1 and sum(f.stat().st_blocks for f in ft.glob("*.safetensors")) < 64
    args = ["--sizes", "tiny", "--hollow", "--fetch", "2", "--bandwidth", "1gbit", "--latency", "0.01"]
    results = bench_llm.main([*args, "--cache", str(tmp_path)])
    assert [(r["job"], r["bandwidth"], r["latency"]) for r in results] == [
        ("hub-fetch", 125e6, 0.01),
        ("hub-fetch", 125e6, 0.0),
        ("hub-fetch", None, 0.0),
    ]
    assert all("error" not in r for r in results)
    assert len({r["bytes_sent"] for r in results}) == 1 and results[0]["bytes_sent"] > 0
    printed = capsys.readouterr().out
    assert "1 Gbit/s, 10 ms" in printed and "x bytes/bandwidth" in printed and "MB/s: the local Hub" in printed
