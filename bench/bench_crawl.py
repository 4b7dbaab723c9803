"""A crawl of a thousand Hub repos that loses nothing: ``modelvec embed BASE`` through a misbehaving local Hub.

The local Hub (:mod:`modelvec.testing.localhub`) holds one tiny BERT base and N fine-tunes of it, made cheaply
(:func:`make_world`): full fine-tunes with planted deltas and PEFT LoRA adapters, one dataset per repo named in its
model card with the base, a few with bad files (a truncated safetensors, another model's shapes), and one repository
that its owner deletes in the middle of the run. The Hub misbehaves at a seeded random rate across the whole crawl
(:func:`misbehave`): 429 with ``Retry-After``, 5xx, connections reset before an answer or mid-body, answers that
stall past the client's timeout. Every model must end embedded, or recorded in the store's failures with its kind.

Each crawl is ``modelvec embed BASE --json --no-keep-weights`` in a fresh process with its own Hugging Face cache:
uninterrupted (timed), then killed with SIGKILL at a random point (seeded: after a random share of the Hub requests
the uninterrupted run made) and run again to completion. The store then holds exactly what the uninterrupted run's
does (models, their keys, vector checksums, labels, failures and their kinds, the catalogue), and the second run
computed none of what the first had stored. The same on a local Ray cluster (``ray start --head``, 2 workers),
compared with the local engine's store.

Run: ``python bench/bench_crawl.py [--repos 1000] [--rate 0.03] [--seed 0] [--engines local,ray] [--workers 2]
[--quantized-every N]`` (``N``: every Nth full fine-tune also has a GGUF, a GPTQ and a bitsandbytes nf4 child).
tests/run/test_crawl.py runs the same code on a few dozen repos.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from safetensors.numpy import load_file, save_file

from modelvec.testing.localhub import HubServer, LocalHub

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache" / "bench" / "crawl"
BIN = Path(sys.executable).parent
BASE_ID = "google-bert/bert-base-uncased"  # a supported family's id; its weights here are a tiny BERT
DATASETS = ("imdb", "glue/sst2", "ag_news", "squad", "yelp_review_full")
AUTHORS = tuple(f"lab{i:02d}" for i in range(20))
TINY = dict(
    vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
    max_position_embeddings=32,
)  # fmt: skip
BAD_EVERY = 97  # every 97th repo has a bad file (content failures: ~1 %)
QUANTIZED = ("gguf", "gptq", "nf4")  # the quantized derivatives a fine-tune has with --quantized-every
TIMEOUT = 2  # the client's timeouts in these crawls (MODELVEC_HUB_TIMEOUT, HF_HUB_DOWNLOAD_TIMEOUT)


# ---------------------------------------------------------------- the world: a base and N repos on a local Hub


@dataclass
class World:
    """The published Hub: its root, the base id, every fine-tune repo and what should become of it."""

    root: Path
    base: str
    repos: list[str]
    expect: dict[str, str]  # repo -> "embedded", "content" (a bad file) or "transient" (deleted mid-run)
    doomed: str  # the repository deleted mid-run
    doomed_files: dict[str, Path] = field(default_factory=dict)
    doomed_meta: dict[str, Any] = field(default_factory=dict)
    page_size: int = 1000  # the Hub's own page size for model listings

    def hub(self) -> LocalHub:
        return LocalHub(self.root / "hub", page_size=self.page_size)


def _card(dataset: str, adapter: bool) -> bytes:
    meta = {"base_model": BASE_ID, "datasets": [dataset], "license": "apache-2.0"}
    if adapter:
        meta["library_name"] = "peft"
    return ("---\n" + yaml.safe_dump(meta, sort_keys=False) + "---\n# a fine-tune\n").encode()


def _templates(root: Path) -> tuple[Path, dict[str, Any], Path]:
    """The base (a random tiny BertModel), a PEFT LoRA adapter config made by peft itself, and a model of other
    shapes; made once per world with transformers and peft."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    base = root / "base"
    BertModel(BertConfig(**TINY)).save_pretrained(base)
    peft_model = get_peft_model(
        BertModel(BertConfig(**TINY)),
        LoraConfig(r=4, lora_alpha=8, target_modules=["query", "value"], init_lora_weights=False),
    )
    peft_model.save_pretrained(root / "adapter")
    adapter = json.loads((root / "adapter" / "adapter_config.json").read_text())
    adapter["base_model_name_or_path"] = BASE_ID
    other = root / "other-shapes"
    BertModel(BertConfig(**{**TINY, "intermediate_size": 96})).save_pretrained(other)
    return base, adapter, root / "adapter" / "adapter_model.safetensors"


def _full(base: dict[str, np.ndarray], dataset: int, seed: int) -> dict[str, np.ndarray]:
    """A full fine-tune: every layer matrix plus a dataset's rank-2 direction and the model's own noise."""
    data, own = np.random.default_rng(1000 + dataset), np.random.default_rng(seed)
    out = {}
    for key, w in sorted(base.items()):
        if ".layer." in key and key.endswith(".weight") and w.ndim == 2:
            shared = data.standard_normal((w.shape[0], 2)) @ data.standard_normal((2, w.shape[1]))
            noise = own.standard_normal(w.shape)
            w = w + 0.02 * (shared / np.linalg.norm(shared) + 0.3 * noise / np.linalg.norm(noise))
        out[key] = np.ascontiguousarray(w, dtype=np.float32)
    return out


def _lora(template: dict[str, np.ndarray], dataset: int, seed: int) -> dict[str, np.ndarray]:
    """A LoRA adapter of peft's tensor names and shapes: a dataset's factors plus the model's own noise."""
    data, own = np.random.default_rng(2000 + dataset), np.random.default_rng(seed)
    return {
        key: (0.1 * data.standard_normal(t.shape) + 0.03 * own.standard_normal(t.shape)).astype(np.float32)
        for key, t in sorted(template.items())
    }


def _quantizations(folder: Path, repo: str, out: Path) -> dict[str, Path]:
    """The full fine-tune in ``folder`` quantized as its Hub derivatives are: a GGUF Q8_0 (llama.cpp's layout), a
    GPTQ 4-bit and a bitsandbytes nf4 repo, each a folder with a card naming ``repo`` as what it quantizes."""
    from modelvec.testing.gguf import Q, write_gguf
    from modelvec.testing.quantized import write_quantized

    card = f"---\nbase_model: {repo}\nbase_model_relation: quantized\n---\n".encode()
    made = {}
    for kind in QUANTIZED:
        target = out / f"{repo.split('/')[1].replace('-ft-', f'-{kind}-')}"
        if kind == "gguf":
            target.mkdir(parents=True)
            write_gguf(folder, target / "model-Q8_0.gguf", "bert", Q.Q8_0)
        else:
            write_quantized(folder, target, kind, group=32, nested=True)  # group: GPTQ's, nested: nf4's
        (target / "README.md").write_bytes(card)
        made[f"{repo.split('/')[0]}/{target.name}"] = target
    return made


def make_world(root: Path, n: int, seed: int = 0, bad_every: int = BAD_EVERY, quantized_every: int = 0) -> World:
    """Publish the base and ``n`` fine-tunes (half full fine-tunes, half LoRA adapters) on a local Hub in ``root``.

    Each repo's files are written once and hard-linked into the Hub, so a thousand tiny repos cost a few tens of MB
    and seconds. Every ``bad_every``-th repo has a bad file; the last one (fewest downloads, so the crawl reaches it
    last) is deleted mid-run by :func:`misbehave`. Every ``quantized_every``-th full fine-tune (0: none) also has
    its quantizations (:func:`_quantizations`), children the crawl finds through it.
    """
    if root.exists():
        shutil.rmtree(root)
    base, adapter_config, adapter_template = _templates(root / "templates")
    hub = LocalHub(root / "hub", page_size=1000)
    hub.publish(BASE_ID, {p.name: p for p in base.iterdir() if p.is_file()}, downloads=10**7, link=True)
    base_weights = load_file(str(base / "model.safetensors"))
    lora_template = load_file(str(adapter_template))
    config = (base / "config.json").read_bytes()
    repos, expect = [], {}
    for i in range(n):
        adapter, dataset = i % 2 == 1, (i * 7 + seed) % len(DATASETS)
        slug = DATASETS[dataset].replace("/", "-")
        repo = f"{AUTHORS[i % len(AUTHORS)]}/tiny-{'lora' if adapter else 'ft'}-{slug}-{i:04d}"
        folder = root / "src" / repo
        folder.mkdir(parents=True)
        (folder / "README.md").write_bytes(_card(DATASETS[dataset], adapter))
        expect[repo] = "embedded"
        if adapter:
            save_file(_lora(lora_template, dataset, seed * 100_000 + i), str(folder / "adapter_model.safetensors"))
            (folder / "adapter_config.json").write_text(json.dumps(adapter_config))
        else:
            save_file(_full(base_weights, dataset, seed * 100_000 + i), str(folder / "model.safetensors"))
            (folder / "config.json").write_bytes(config)
        if i % bad_every == bad_every - 1:
            shapes = not adapter and (i // bad_every) % 4 < 2
            _spoil(folder, root / "templates" / "other-shapes", adapter, shapes)
            expect[repo] = "content"
        files = {p.name: p for p in folder.iterdir()}
        hub.publish(repo, files, link=True, downloads=100_000 - i, author=repo.split("/")[0])
        repos.append(repo)
        if quantized_every and not adapter and expect[repo] == "embedded" and (i // 2) % quantized_every == 0:
            for child, made in _quantizations(folder, repo, root / "src-quantized").items():
                files = {p.name: p for p in made.iterdir()}
                hub.publish(child, files, link=True, downloads=1_000 - i // 2, author=child.split("/")[0])
                repos.append(child)
                expect[child] = "embedded"
    doomed = [r for r in repos if "-ft-" in r or "-lora-" in r][-1]
    expect[doomed] = "transient"
    files = {p.name: p for p in (root / "src" / doomed).iterdir()}
    return World(root, BASE_ID, repos, expect, doomed, files, {"downloads": 100_000 - n + 1})


def _spoil(folder: Path, other: Path, adapter: bool, shapes: bool) -> None:
    """A bad file: the weights cut in half, or (``shapes``) a full fine-tune of another model's shapes."""
    weights = folder / ("adapter_model.safetensors" if adapter else "model.safetensors")
    if not shapes:
        data = weights.read_bytes()
        weights.write_bytes(data[: len(data) // 2])
        return
    shutil.copyfile(other / "model.safetensors", weights)
    shutil.copyfile(other / "config.json", folder / "config.json")


def misbehave(world: World, hub: LocalHub, rate: float, seed: int, delete_after: int) -> None:
    """The Hub's own misbehaviour at ``rate`` (the share of requests that go wrong), seeded, and the doomed repo
    deleted when the ``delete_after``-th file request comes in (published again first if an earlier crawl
    deleted it: each crawl starts from the same Hub)."""
    hub.clear_faults()
    if world.doomed not in hub.repos():
        hub.publish(world.doomed, world.doomed_files, link=True, author=world.doomed.split("/")[0], **world.doomed_meta)
    files, every = "/*/resolve/*", "*"
    mix = [  # (pattern, share of the rate, fault)
        (every, 0.25, dict(status=429, retry_after=1)),
        (every, 0.15, dict(status=503)),
        (files, 0.15, dict(status=500)),
        (files, 0.15, dict(kind="reset")),  # before any answer
        (files, 0.15, dict(kind="reset", after_bytes=200)),  # mid-body (GET)
        (files, 0.15, dict(kind="slow", delay=TIMEOUT + 1.0)),  # stalls past the client's timeout
    ]
    for i, (pattern, share, fault) in enumerate(mix if rate > 0 else []):  # listings and model info: statuses only
        hub.fail(pattern, times=None, rate=rate * share, seed=seed * 100 + i, **fault)  # type: ignore[arg-type]
    hub.delete(world.doomed, after=delete_after, pattern=files)


# ---------------------------------------------------------------- one crawl: `modelvec embed BASE` in a process


@dataclass
class Crawl:
    """What one ``modelvec embed`` process did."""

    seconds: float
    returncode: int
    answer: dict[str, Any] | None  # its --json answer (None when killed)
    requests: int  # Hub requests while it ran
    sent: int  # file bytes the Hub sent while it ran
    stderr: str = ""
    faults: dict[str, int] = field(default_factory=dict)  # the Hub's misbehaviour while it ran, by kind
    log: list[dict[str, Any]] = field(default_factory=list)  # the Hub's log of the requests it answered meanwhile


def crawl_env(endpoint: str, cache: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a crawl: the local Hub, its own cache, short timeouts and a quick first backoff."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "MODELVEC_"))}
    env.update(
        HF_ENDPOINT=endpoint,
        HF_HUB_CACHE=str(cache),
        HF_HUB_DISABLE_PROGRESS_BARS="1",
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_DOWNLOAD_TIMEOUT=str(TIMEOUT),
        MODELVEC_HUB_TIMEOUT=str(TIMEOUT),
        MODELVEC_HUB_BACKOFF="0.2",
        OMP_NUM_THREADS="1",
        RAY_USAGE_STATS_ENABLED="0",
    )
    env.update(extra or {})
    return env


def crawl(
    server: HubServer,
    store: Path,
    env: dict[str, str],
    engine: list[str] | None = None,
    kill_at: int | None = None,
    timeout: float = 3600,
) -> Crawl:
    """``modelvec embed BASE`` into ``store``; with ``kill_at``, SIGKILLed once the Hub has answered that many
    requests in all (counting from before this run)."""
    cmd = [str(BIN / "modelvec"), "embed", BASE_ID, "--store", str(store), "--json", "--no-keep-weights"]
    start_requests, start_sent = len(server.requests), server.bytes_sent()
    start = time.monotonic()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([*cmd, *(engine or [])], env=env, stdout=out, stderr=err)
        try:
            while proc.poll() is None:
                if kill_at is not None and len(server.requests) >= kill_at:
                    os.kill(proc.pid, signal.SIGKILL)
                    break
                if time.monotonic() - start > timeout:
                    raise TimeoutError(f"the crawl into {store} took more than {timeout:.0f} s")
                time.sleep(0.005)
        finally:
            if proc.poll() is None and kill_at is None:
                proc.kill()
        code = proc.wait()
        seconds = time.monotonic() - start
        out.seek(0)
        err.seek(0)
        text, stderr = out.read(), err.read()
    answer = json.loads(text) if code in (0, 1) and text.strip() else None
    answered = server.requests[start_requests:]
    faults = Counter(_fault_name(r) for r in answered if r["fault"])
    return Crawl(
        seconds,
        code,
        answer,
        len(answered),
        server.bytes_sent() - start_sent,
        stderr[-4000:],
        dict(sorted(faults.items())),
        list(answered),
    )


def endpoint(record: dict[str, Any]) -> str:
    """What a request asked for: a listing, a model's info, a file's HEAD, a whole file, or a byte range."""
    path = record["path"]
    if path.startswith("/api/models"):
        return "listing" if path.rstrip("/") == "/api/models" else "model info"
    if "/resolve/" in path:
        if record["method"] == "HEAD":
            return "file HEAD"
        return "byte range" if record["range"] else "whole file"
    return "other"


def requests_by_endpoint(log: list[dict[str, Any]]) -> dict[str, int]:
    return dict(sorted(Counter(endpoint(r) for r in log).items()))


def requests_per_repo(log: list[dict[str, Any]], repos: list[str]) -> dict[str, float]:
    """Requests naming each repo (its files, its info) by kind of repo, averaged; the rest (listings, the base) are
    shared by every model."""
    per = Counter()
    for r in log:
        path = r["path"]
        repo = path.split("/resolve/")[0].strip("/") if "/resolve/" in path else "/".join(path.split("/")[3:5])
        per[repo] += 1
    full = [r for r in repos if "-ft-" in r]
    lora = [r for r in repos if "-lora-" in r]
    own = sum(per[r] for r in repos)
    quantized = {
        f"{kind}_own": round(sum(per[r] for r in mine) / len(mine), 2)
        for kind in QUANTIZED
        if (mine := [r for r in repos if f"-{kind}-" in r])
    }
    return {
        "full_finetune_own": round(sum(per[r] for r in full) / max(1, len(full)), 2),
        "adapter_own": round(sum(per[r] for r in lora) / max(1, len(lora)), 2),
        **quantized,
        "shared_per_model": round((len(log) - own) / max(1, len(repos)), 2),
        "all_per_model": round(len(log) / max(1, len(repos)), 2),
    }


def _fault_name(record: dict[str, Any]) -> str:
    """A logged fault as the crawl's report names it: ``429``, ``5xx``, ``reset`` or ``stall``."""
    if record["fault"] == "status":
        return str(record["status"]) if record["status"] == 429 else "5xx"
    return {"slow": "stall"}.get(record["fault"], record["fault"])


def quiet(server: HubServer, seconds: float = 1.5, limit: float = 30) -> None:
    """Wait until no request has come in for ``seconds``: a killed driver's Ray workers take a moment to go."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        seen = len(server.requests)
        time.sleep(seconds)
        if len(server.requests) == seen:
            return


# ---------------------------------------------------------------- what a store holds

EMPTY: dict[str, Any] = {"vectors": [], "failures": [], "catalogue": []}  # a store a killed run never created


def contents(store: Path) -> dict[str, Any]:
    """Everything a crawl leaves in the store, minus timings and dates: each vector's keys, labels and checksum,
    each failure with its kind, the catalogue."""
    import duckdb

    con = duckdb.connect(str(store), read_only=True)
    try:
        vectors = con.execute(
            "SELECT model, model_hash, base, base_hash, params, architecture, dim, vector_hash, datasets, "
            "label_source, author, source, adapter FROM vectors ORDER BY model, base, params"
        ).fetchall()
        failures = con.execute(
            "SELECT model, base, params, error, model_hash, kind FROM failures ORDER BY model, base, params"
        ).fetchall()
        catalogue = con.execute(
            "SELECT base, model, kept, reason, sha, datasets, label_source FROM catalogue ORDER BY base, model"
        ).fetchall()
    finally:
        con.close()
    return {"vectors": vectors, "failures": failures, "catalogue": catalogue}


def differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """How two stores' contents differ, one line per table (empty when they are equal)."""
    out = []
    for table in ("vectors", "failures", "catalogue"):
        left, right = set(map(repr, a[table])), set(map(repr, b[table]))
        if left != right or len(a[table]) != len(b[table]):
            only_a, only_b = sorted(left - right)[:2], sorted(right - left)[:2]
            out.append(
                f"{table}: {len(a[table])} vs {len(b[table])} rows; only in one: {only_a}; only in the other: {only_b}"
            )
    return out


def check_outcomes(world: World, store: Path) -> list[str]:
    """Every repo embedded or recorded with the kind it should have: what is not so, one line each."""
    found = contents(store)
    kinds = {row[0]: row[5] for row in found["failures"]}
    embedded = {row[0] for row in found["vectors"]}
    wrong = []
    for repo, expect in world.expect.items():
        got = "embedded" if repo in embedded else kinds.get(repo, "missing")
        if got != expect:
            wrong.append(f"{repo}: {got}, expected {expect}")
    return wrong


def written_at(store: Path) -> dict[str, Any]:
    """When each stored model's row was written (a model computed again is written again)."""
    import duckdb

    if not store.exists():
        return {}
    con = duckdb.connect(str(store), read_only=True)
    try:
        return dict(con.execute("SELECT model, created_at FROM vectors").fetchall())
    finally:
        con.close()


# ---------------------------------------------------------------- kill and resume


def killed_and_resumed(
    server: HubServer, store: Path, env: dict[str, str], engine: list[str] | None, kill_at: int
) -> dict[str, Any]:
    """A crawl killed with SIGKILL after ``kill_at`` more Hub requests, then run again to completion: both runs,
    and whether the second computed anything the first had stored."""
    first = crawl(server, store, env, engine, kill_at=len(server.requests) + kill_at)
    if engine:
        quiet(server)
    before, killed = written_at(store), contents(store) if store.exists() else EMPTY
    second = crawl(server, store, env, engine)
    answer = second.answer or {}
    after = written_at(store)
    done = Counter(_ask(r) for r in first.log if r["status"] in (200, 206))
    repeated = Counter()
    for r in second.log:
        if done[_ask(r)] > 0:
            done[_ask(r)] -= 1
            repeated[endpoint(r)] += 1
    return {
        "first": first,
        "killed": killed,
        "second": second,
        "stored_when_killed": len(before),
        "catalogue_when_killed": len(killed["catalogue"]),
        "kept_after_resume": _kept(killed, contents(store)),
        "repeated_after_kill": dict(sorted(repeated.items())),
        "computed_twice": sorted(set(before) & set(answer.get("embedded", []))),
        "rewritten": sorted(m for m, when in before.items() if after.get(m) != when),
        "skipped_on_resume": len(answer.get("skipped", [])),
    }


def _ask(record: dict[str, Any]) -> tuple:
    """A request as asked (method, path, query, range): the same ask answered before the kill and again after it
    is work the kill lost."""
    query = tuple(sorted((k, tuple(v)) for k, v in record["query"].items()))
    return record["method"], record["path"], query, record["range"]


def _kept(killed: dict[str, Any], final: dict[str, Any]) -> bool:
    """Whether every vector and catalogue row stored before the kill is in the final store as it was."""
    return all(set(map(repr, killed[t])) <= set(map(repr, final[t])) for t in ("vectors",)) and {
        row[1] for row in killed["catalogue"]
    } <= {row[1] for row in final["catalogue"]}


@contextlib.contextmanager
def ray_cluster(cpus: int = 2) -> Iterator[dict[str, str]]:
    """A local Ray cluster (``ray start --head --block``, stopped at the end); the environment a driver needs to
    reach it (``--address``, token authentication)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    temp_dir = tempfile.mkdtemp(prefix="mvcrawl-", dir="/tmp")  # Ray's socket paths must fit in 107 bytes
    env = dict(os.environ, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=uuid.uuid4().hex, RAY_USAGE_STATS_ENABLED="0")
    env.pop("RAY_ADDRESS", None)
    head = subprocess.Popen(
        [str(BIN / "ray"), "start", "--head", "--block", "--port", str(port), "--num-cpus", str(cpus),
         "--include-dashboard=false", "--disable-usage-stats", "--temp-dir", temp_dir],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        log = []
        for line in head.stdout:  # type: ignore[union-attr]
            log.append(line)
            if "Ray runtime started" in line:
                break
        else:
            raise RuntimeError("ray start did not start:\n" + "".join(log[-20:]))
        yield {
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": env["RAY_AUTH_TOKEN"],
            "RAY_ADDRESS": f"127.0.0.1:{port}",
        }
    finally:
        head.send_signal(signal.SIGTERM)  # `ray start --block` stops its cluster's processes as it exits
        try:
            head.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()
        shutil.rmtree(temp_dir, ignore_errors=True)


# ---------------------------------------------------------------- the benchmark


def _summary(name: str, run: Crawl, found: dict[str, Any]) -> dict[str, Any]:
    """One crawl's figures (``found``: its store's contents after it); models/s counts the models it ended
    (embedded or failed) over its whole wall time, start-up and discovery included."""
    kinds = Counter(row[5] for row in found["failures"])
    answer = run.answer or {}
    ended = len(answer.get("embedded", [])) + len(answer.get("failed", {})) - len(answer.get("recorded", []))
    return {
        "run": name,
        "seconds": round(run.seconds, 1),
        "models_ended": ended if run.answer else None,
        "models_per_s": round(ended / run.seconds, 2) if run.answer else None,
        "stored": len(found["vectors"]),
        "failures_by_kind": dict(sorted(kinds.items())),
        "hub_requests": run.requests,
        "hub_faults": run.faults,
        "hub_file_bytes": run.sent,
        "exit": run.returncode,
    }


def kill_points(whole: Crawl, rng: random.Random) -> dict[str, int]:
    """Where to kill a crawl (after this many Hub requests), from the uninterrupted run's log: during discovery (just
    after the middle one of its listing pages) and during embedding (a seeded random point after
    discovery's first page)."""
    listings = [i for i, r in enumerate(whole.log) if endpoint(r) == "listing" and r["status"] == 200]
    discovery = listings[len(listings) // 2] + 1 if listings else 1
    first = (listings[0] + 1) if listings else 1
    return {"discovery": discovery, "embedding": int(first + (whole.requests - first) * rng.uniform(0.1, 0.9))}


def bench_engine(world: World, rate: float, seed: int, engine: str, workers: int, work: Path) -> dict[str, Any]:
    """One engine: an uninterrupted crawl, then crawls killed during discovery and during embedding, each resumed."""
    hub = world.hub()
    rng = random.Random(seed)
    out: dict[str, Any] = {"engine": engine, "runs": []}
    with hub.serve() as server, ray_cluster() if engine == "ray" else contextlib.nullcontext({}) as ray_env:
        flags = ["--engine", engine, "--workers", str(workers)]
        if engine == "ray":
            flags += ["--address", ray_env["RAY_ADDRESS"]]
        extra = {k: v for k, v in ray_env.items() if k != "RAY_ADDRESS"}
        delete_after = len(world.repos)  # file requests: about a third of the way through the crawl
        misbehave(world, hub, rate, seed, delete_after)
        whole_store = work / f"{engine}-whole.duckdb"
        whole = crawl(server, whole_store, crawl_env(server.endpoint, work / f"{engine}-hf1", extra), flags)
        out["runs"].append(_summary("uninterrupted", whole, contents(whole_store)))
        out["requests_by_endpoint"] = requests_by_endpoint(whole.log)
        out["requests_per_model"] = requests_per_repo(whole.log, world.repos)
        for n, (during, kill_at) in enumerate(kill_points(whole, rng).items()):
            misbehave(world, hub, rate, seed + 1 + n, delete_after)
            store = work / f"{engine}-killed-{during}.duckdb"
            env = crawl_env(server.endpoint, work / f"{engine}-hf-{during}", extra)
            resumed = killed_and_resumed(server, store, env, flags, kill_at)
            out["runs"] += [
                _summary(f"killed during {during} after {kill_at} requests", resumed["first"], resumed["killed"]),
                _summary(f"resumed after the {during} kill", resumed["second"], contents(store)),
            ]
            out[f"killed_during_{during}"] = {
                "kill_at": kill_at,
                "stored_when_killed": resumed["stored_when_killed"],
                "catalogue_when_killed": resumed["catalogue_when_killed"],
                "kept_after_resume": resumed["kept_after_resume"],
                "repeated_after_kill": resumed["repeated_after_kill"],
                "skipped_on_resume": resumed["skipped_on_resume"],
                "computed_twice": resumed["computed_twice"],
                "rewritten": resumed["rewritten"],
                "outcomes_wrong": check_outcomes(world, store),
                "resumed_vs_uninterrupted": differences(contents(store), contents(whole_store)),
                "resumed_vs_local_uninterrupted": differences(contents(store), contents(work / "local-whole.duckdb")),
            }
    out["outcomes_wrong"] = check_outcomes(world, whole_store)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repos", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=0.03, help="share of Hub requests that go wrong")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--engines", default="local,ray")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, default=CACHE)
    parser.add_argument("--page-size", type=int, default=1000, help="models per listing page (the Hub's: 1000)")
    parser.add_argument(
        "--quantized-every", type=int, default=0, help="every Nth full fine-tune also quantized: GGUF, GPTQ, nf4"
    )
    args = parser.parse_args()
    start = time.monotonic()
    world = make_world(args.out / "world", args.repos, args.seed, quantized_every=args.quantized_every)
    world.page_size = args.page_size
    print(f"world: {args.repos} repos published in {time.monotonic() - start:.1f} s", flush=True)
    results = []
    work = args.out / "runs"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    engines = args.engines.split(",")
    for engine in ["local", *(e for e in engines if e != "local")]:  # the local engine's store is the reference
        results.append(bench_engine(world, args.rate, args.seed, engine, args.workers, work))
        print(json.dumps(results[-1], indent=1, default=str), flush=True)
    (args.out / "bench_crawl.json").write_text(json.dumps(results, indent=1, default=str))
    _table(results, args)


def _table(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    """The figures as a Markdown table, and the verdicts."""
    print(f"\n{args.repos} repos, fault rate {args.rate}, seed {args.seed}, {args.workers} workers")
    print("| engine | run | seconds | models/s | stored | failures by kind | Hub requests | Hub faults | file bytes |")
    print("|---|---|--:|--:|--:|---|--:|---|--:|")
    for result in results:
        for run in result["runs"]:
            kinds = ", ".join(f"{k} {n}" for k, n in run["failures_by_kind"].items())
            faults = ", ".join(f"{k} {n}" for k, n in run["hub_faults"].items())
            print(
                f"| {result['engine']} | {run['run']} | {run['seconds']} | {run['models_per_s'] or '–'} | "
                f"{run['stored']} | {kinds} | {run['hub_requests']} | {faults} | {run['hub_file_bytes']:,} |"
            )
    for result in results:
        print(
            f"{result['engine']}: requests by endpoint {result['requests_by_endpoint']}; {result['requests_per_model']}"
        )
        for during in ("discovery", "embedding"):
            k = result[f"killed_during_{during}"]
            same = not k["resumed_vs_uninterrupted"] and not k["resumed_vs_local_uninterrupted"]
            print(
                f"{result['engine']}, killed during {during} after {k['kill_at']} requests: {k['stored_when_killed']} "
                f"vectors and {k['catalogue_when_killed']} catalogue rows stored, kept after resume: "
                f"{k['kept_after_resume']}; requests asked again {k['repeated_after_kill']}; resumed skipping "
                f"{k['skipped_on_resume']}; computed twice {len(k['computed_twice'])}, rows rewritten "
                f"{len(k['rewritten'])}; every model embedded or recorded with its kind: "
                f"{not k['outcomes_wrong'] and not result['outcomes_wrong']}; final store equals the uninterrupted "
                f"runs' (this engine's and the local engine's): {same}"
            )


if __name__ == "__main__":
    main()
