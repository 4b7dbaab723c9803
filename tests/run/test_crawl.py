"""A crawl of Hub repos that loses nothing: ``modelvec embed BASE`` over a few dozen repos of a misbehaving local Hub.

The world and the crawl are bench/bench_crawl.py's (the benchmark runs the same code on a thousand repos): full
fine-tunes and LoRA adapters of a tiny BERT, a few with bad files, one repository deleted mid-run, and the Hub's
own faults at a seeded random rate (429 with Retry-After, 5xx, resets, stalls). Each crawl runs in a fresh
process; a killed one is SIGKILLed at a seeded random point and run again, and the store must then hold exactly
what an uninterrupted crawl's holds, with nothing the killed run stored computed again. The same on a local Ray
cluster with 2 workers, compared with the local engine's store.
"""

from __future__ import annotations

import io
import random
import re
import sys
from collections import Counter
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import bench_crawl  # noqa: E402

sys.path.remove(str(BENCH))

N_REPOS = 40  # 20 full fine-tunes and 20 adapters: 4 with bad files, the last one deleted mid-run
BAD_EVERY = 9
RATE = 0.05  # a twentieth of the Hub's answers go wrong
SEED = 7


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> bench_crawl.World:
    return bench_crawl.make_world(tmp_path_factory.mktemp("crawl") / "world", N_REPOS, SEED, bad_every=BAD_EVERY)


@pytest.fixture(scope="module")
def whole(world, tmp_path_factory):
    """The local engine's uninterrupted crawl: its store (the reference), the run, and the faults the Hub made."""
    work = tmp_path_factory.mktemp("whole")
    hub = world.hub()
    with hub.serve() as server:
        bench_crawl.misbehave(world, hub, RATE, SEED, delete_after=N_REPOS)
        run = bench_crawl.crawl(server, work / "s.duckdb", bench_crawl.crawl_env(server.endpoint, work / "hf"))
        faults = Counter(r["fault"] for r in server.requests if r["fault"])
    return work / "s.duckdb", run, faults


def test_every_model_is_embedded_or_recorded_with_its_kind(world, whole):
    store, run, faults = whole
    assert run.returncode == 1, run.stderr  # some models failed: the bad files and the deleted repository
    assert sum(faults.values()) >= 3 and {"status", "reset"} <= set(faults), faults  # the Hub misbehaved
    assert bench_crawl.check_outcomes(world, store) == []
    expected = Counter(world.expect.values())
    assert expected == {"embedded": N_REPOS - 5, "content": 4, "transient": 1}
    found = bench_crawl.contents(store)
    assert Counter(row[5] for row in found["failures"]) == {"content": 4, "transient": 1}
    assert sorted(run.answer["failed"]) == sorted(r for r, e in world.expect.items() if e != "embedded")
    for repo, line in run.answer["failed"].items():
        assert line.startswith(f"{repo}: ") and "\n" not in line
    assert "repository not found" in run.answer["failed"][world.doomed]
    adapters = {row[0]: row[12] for row in found["vectors"]}
    assert Counter(adapters.values()) == {False: 18, True: 17}  # LoRA adapters and full fine-tunes, each its kind
    assert run.sent > 0


def _kill_point(whole_run) -> int:
    """A seeded random point of the crawl: after this many Hub requests (of those an uninterrupted run makes)."""
    return int(whole_run.requests * random.Random(SEED).uniform(0.15, 0.85))


def _assert_resumed_equals(resumed: dict, store: Path, reference: Path) -> None:
    first, second = resumed["first"], resumed["second"]
    assert first.returncode == -9 and first.answer is None  # killed mid-run
    assert second.returncode == 1, second.stderr  # completed (some models fail, as in the uninterrupted run)
    assert resumed["computed_twice"] == []  # nothing the killed run stored was computed again
    assert resumed["skipped_on_resume"] == resumed["stored_when_killed"]
    assert resumed["rewritten"] == []  # and their rows were not written again
    assert bench_crawl.differences(bench_crawl.contents(store), bench_crawl.contents(reference)) == []


def test_a_crawl_killed_at_a_random_point_resumes_losing_nothing(world, whole, tmp_path):
    reference, run, _ = whole
    hub = world.hub()
    with hub.serve() as server:
        bench_crawl.misbehave(world, hub, RATE, SEED + 1, delete_after=N_REPOS)
        env = bench_crawl.crawl_env(server.endpoint, tmp_path / "hf")
        resumed = bench_crawl.killed_and_resumed(server, tmp_path / "s.duckdb", env, None, _kill_point(run))
    _assert_resumed_equals(resumed, tmp_path / "s.duckdb", reference)


def test_the_same_on_a_ray_cluster_with_two_workers(world, whole, tmp_path, ray_turn):
    pytest.importorskip("ray")
    reference, run, _ = whole
    hub = world.hub()
    with bench_crawl.ray_cluster() as ray_env, hub.serve() as server:
        bench_crawl.misbehave(world, hub, RATE, SEED + 2, delete_after=N_REPOS)
        flags = ["--engine", "ray", "--workers", "2", "--address", ray_env["RAY_ADDRESS"]]
        extra = {k: v for k, v in ray_env.items() if k != "RAY_ADDRESS"}
        env = bench_crawl.crawl_env(server.endpoint, tmp_path / "hf", extra)
        resumed = bench_crawl.killed_and_resumed(server, tmp_path / "s.duckdb", env, flags, _kill_point(run))
    _assert_resumed_equals(resumed, tmp_path / "s.duckdb", reference)


# --- the progress line ---------------------------------------------------------------------------------------------

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def test_the_progress_line_shows_models_bytes_and_time_left_on_one_line(monkeypatch):
    from rich.console import Console

    from modelvec.cli import embed as cli_embed
    from modelvec.run import Step

    screen = io.StringIO()
    monkeypatch.setattr(cli_embed, "err", Console(file=screen, force_terminal=True, width=80, color_system=None))
    now = [0.0]
    monkeypatch.setattr(cli_embed, "_clock", lambda: now[0])
    with cli_embed.ProgressLine(discovering=True, quiet=False) as on_step:
        on_step(Step("begin", total=1000))
        for i in range(250):  # a resumed run: what was stored goes by at once
            on_step(Step("skipped", f"m{i}", "already stored"))
        for i in range(250, 300):  # then a model a second
            now[0] += 1.0
            on_step(Step("embedded", f"m{i}", "1.00s", fetched=2_000_000))
    frames = [f for f in re.split(r"[\r\n]", _ANSI.sub("", screen.getvalue())) if f.strip()]
    assert frames and all(len(f) <= 80 for f in frames)  # one line, redrawn in place
    last = frames[-1]
    assert "embedding" in last and "300/1000" in last and "100.0 MB fetched" in last
    # the time left at the pace of the 50 models computed, not of the 250 skipped: 700 models at 1 a second
    assert "ETA 0:11:40" in last, last


def test_no_progress_line_with_json(monkeypatch, tiny_bert, tiny_finetunes, tmp_path):
    from typer.testing import CliRunner

    from modelvec.cli import app

    args = ["embed", "--base", str(tiny_bert), *map(str, tiny_finetunes), "--store", str(tmp_path / "s.duckdb")]
    quiet = CliRunner().invoke(app, [*args, "--json"])
    assert quiet.exit_code == 0 and quiet.stderr == "", quiet.stderr
    shown = CliRunner().invoke(app, [*args, "--force"])
    assert shown.exit_code == 0 and "3/3" in shown.stderr and "0 bytes fetched" in shown.stderr, shown.stderr
