"""One error model: every failure a ModelvecError with a kind; resource failures are retried, never stored
as a property of the model; errors cross process boundaries intact."""

from __future__ import annotations

import errno
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import modelvec
from builders import planted_finetune, save_state
from modelvec.core import errors as E
from modelvec.core.errors import Kind, ModelvecError, error_of
from modelvec.hub import client as _hub_client  # noqa: F401  (teaches error_of the Hub's errors)
from modelvec.hub.http import httpx2
from modelvec.represent import DeltaEmbedder
from modelvec.store import Store, StoreError, StoreLockedError

CPU_OOM = (
    "[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not enough memory: "
    "you tried to allocate 1073741824 bytes."
)
CUDA_OOM = "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB"


def _all_subclasses(cls: type) -> list[type]:
    out = [cls]
    for sub in cls.__subclasses__():
        out += _all_subclasses(sub)
    return out


def test_every_error_class_is_declared_in_core_errors_with_its_kind():
    """One error model: no exception class of modelvec is defined outside core/errors.py, and each says its kind."""
    import importlib
    import inspect
    import pkgutil

    import modelvec
    from modelvec.core import errors

    for info in pkgutil.walk_packages(modelvec.__path__, "modelvec."):
        if info.name.startswith(("modelvec.testing", "modelvec.cli")) or info.name.endswith("ray_engine"):
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if (
                inspect.isclass(value)
                and issubclass(value, Exception)
                and not issubclass(value, Warning)
                and value.__module__ == info.name
            ):
                assert info.name == "modelvec.core.errors" or name.startswith("_"), f"{info.name}.{name}"
    for value in vars(errors).values():
        if inspect.isclass(value) and issubclass(value, Exception) and value.__module__ == errors.__name__:
            kind = getattr(value, "default_kind", None) or getattr(value, "kind", None)
            assert isinstance(kind, Kind), value.__name__


def test_every_error_pickles_with_its_fields():
    classes = set(_all_subclasses(ModelvecError)) | {StoreError, StoreLockedError}
    assert len(classes) >= 9
    for cls in classes - {StoreLockedError}:
        for kind in (None, Kind.RESOURCE):
            err = cls("org/model\u00e9", "tensor a.b has shape [3], the base's has [4]", kind=kind)
            err.extra = 7  # attributes set after construction travel too
            back = pickle.loads(pickle.dumps(err))
            assert type(back) is cls
            assert (back.model, back.cause, back.kind, str(back), back.extra) == (
                err.model,
                err.cause,
                err.kind,
                str(err),
                7,
            )
    locked = pickle.loads(pickle.dumps(StoreLockedError(Path("/x/s.duckdb"), 41, 2.5)))
    assert (locked.path, locked.pid, locked.waited, locked.kind) == (Path("/x/s.duckdb"), 41, 2.5, Kind.TRANSIENT)
    assert "PID 41" in str(locked)


@pytest.mark.parametrize(
    ("exc", "kind", "words"),
    [
        (RuntimeError(CPU_OOM), Kind.RESOURCE, "out of memory"),
        (torch.OutOfMemoryError(CUDA_OOM), Kind.RESOURCE, "out of memory"),
        (MemoryError(), Kind.RESOURCE, "out of memory"),
        (OSError(errno.ENOMEM, "Cannot allocate memory"), Kind.RESOURCE, "out of memory"),
        (OSError(errno.ENOSPC, "No space left on device"), Kind.RESOURCE, "out of disk space"),
        (RuntimeError("can't start new thread"), Kind.RESOURCE, "out of memory"),
        (TimeoutError("read timed out"), Kind.TRANSIENT, "TimeoutError"),
        (httpx2.ConnectError("connection refused"), Kind.TRANSIENT, "connection refused"),
        (ValueError("bad header\nsecond line"), Kind.CONTENT, "ValueError: bad header"),
    ],
)
def test_any_exception_becomes_one_line_with_a_kind(exc, kind, words):
    try:  # raised from inside a library's own error, as they surface in practice
        try:
            raise exc
        except BaseException as inner:
            raise ValueError("safetensors could not read the file") from inner
    except ValueError as outer:
        err = error_of(outer if kind is Kind.RESOURCE else exc, "org/m")
    assert err.kind is kind and words in str(err) and "\n" not in str(err)
    assert str(err).startswith("org/m: ") and E.reason(exc, "org/m") == str(error_of(exc, "org/m"))


def _oom_once(monkeypatch, message: type[BaseException] | str, target: str = "_embed_one"):
    """Make every embed of a fine-tune (not the base) fail with out-of-memory until undone."""
    original = getattr(DeltaEmbedder, target)

    def boom(self, *args, **kwargs):
        if isinstance(message, str):
            raise RuntimeError(message)
        raise message(CUDA_OOM)

    monkeypatch.setattr(DeltaEmbedder, target, boom)
    return original


@pytest.mark.parametrize("oom", [CPU_OOM, torch.OutOfMemoryError], ids=["cpu", "cuda"])
def test_out_of_memory_is_recorded_as_resource_and_retried_next_run(
    tiny_bert, tiny_finetunes, tmp_path, oom, monkeypatch
):
    store = tmp_path / "s.duckdb"
    with monkeypatch.context() as m:
        _oom_once(m, oom)
        first = modelvec.embed(tiny_bert, tiny_finetunes[:2], store=store)
    assert not first.embedded and len(first.failed) == 2
    assert all("out of memory" in why and "\n" not in why for why in first.failed.values())
    with Store(store) as db:
        failures = db.reads.failures()
    assert set(failures["kind"]) == {"resource"}
    second = modelvec.embed(tiny_bert, tiny_finetunes[:2], store=store)  # the machine has room now
    assert sorted(second.embedded) == sorted(map(str, tiny_finetunes[:2])) and not second.failed
    reference = DeltaEmbedder().fit(tiny_bert).transform(tiny_finetunes[:2])
    assert np.allclose(second.vectors, reference, atol=1e-6)


def test_a_content_failure_is_not_retried_but_a_resource_one_is(tiny_bert, tmp_path, monkeypatch):
    bad = tmp_path / "bad"
    save_state(bad, {"nothing": torch.zeros(2)}, None)
    good = planted_finetune(tiny_bert, tmp_path / "good", seed=5)
    store = tmp_path / "s.duckdb"
    with monkeypatch.context() as m:
        _oom_once(m, CPU_OOM)
        modelvec.embed(tiny_bert, [good], store=store)
    modelvec.embed(tiny_bert, [bad], store=store)
    again = modelvec.embed(tiny_bert, [good, bad], store=store)
    assert again.embedded == [str(good)]  # the resource failure is tried again...
    assert str(bad) in again.failed  # ...the content failure is remembered, not re-read
    with Store(store) as db:
        assert db.reads.failures().set_index("model").loc[str(bad), "kind"] == "content"


def test_out_of_memory_batching_per_family_falls_back_to_layers_on_cpu(tiny_bert, tiny_finetunes, monkeypatch):
    kw = dict(factor="U", solver="exact")  # the SVD factors batch whole families (the sketch streams matrices)
    reference = DeltaEmbedder(**kw, batching="layer").fit(tiny_bert).transform(tiny_finetunes[:2])
    embedder = DeltaEmbedder(**kw, batching="family").fit(tiny_bert)
    calls = []

    def oom(self, *args):
        calls.append(self.batching)
        raise torch.OutOfMemoryError(CUDA_OOM)

    monkeypatch.setattr(DeltaEmbedder, "_family_factors", oom)
    got = embedder.transform(tiny_finetunes[:2])
    assert calls == ["family", "family"]  # tried per family, then layer by layer (which needs no family batch)
    np.testing.assert_allclose(got, reference, atol=1e-6)
    monkeypatch.setattr(DeltaEmbedder, "_layer_factors", lambda self, *a: (_ for _ in ()).throw(RuntimeError(CPU_OOM)))
    with pytest.raises(RuntimeError, match="DefaultCPUAllocator"):  # out of memory there too: the caller records it
        embedder.embed_one(tiny_finetunes[0])


def test_a_linalg_failure_is_caught_but_out_of_memory_is_not(tiny_bert, tiny_finetunes, monkeypatch):
    embedder = DeltaEmbedder(factor="U", batching="layer").fit(tiny_bert)

    def svd_oom(*args, **kwargs):
        raise RuntimeError(CPU_OOM)

    monkeypatch.setattr("modelvec.represent.factors.truncated_svd", svd_oom)
    with pytest.raises(RuntimeError) as caught:
        embedder.embed_one(tiny_finetunes[0])
    assert error_of(caught.value, "m").kind is Kind.RESOURCE  # not "has NaN or Inf values", a content failure


LIMITED = textwrap.dedent("""
    import resource, sys, threading
    import modelvec
    from modelvec.represent import DeltaEmbedder
    from modelvec.run import work

    base, model, store = sys.argv[1:4]
    fit, open_checkpoint, fitted = DeltaEmbedder.fit, work.open_checkpoint, threading.Event()

    def fit_and_tell(self, ck, inputs=None):
        try:
            return fit(self, ck, inputs)
        finally:
            fitted.set()

    def open_limited(path, **kwargs):  # once the base is read, cap the address space near what is in use
        fitted.wait(120)
        in_use = int(next(l for l in open("/proc/self/status") if l.startswith("VmSize")).split()[1]) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (in_use + (32 << 20), resource.RLIM_INFINITY))
        return open_checkpoint(path, **kwargs)

    DeltaEmbedder.fit, work.open_checkpoint = fit_and_tell, open_limited
    result = modelvec.embed(base, [model], store=store, workers=1)
    print(result.failed.get(model, "embedded"))
""")


def test_a_real_memory_limit_fails_the_embed_then_the_same_command_without_it_embeds(tmp_path):
    """An address-space limit (as ``ulimit -v``) that leaves no room to map the fine-tune: a resource
    failure; the same command without the limit embeds the model."""
    gen = torch.Generator().manual_seed(0)
    d, layers = 512, 4  # 4 layers of 512 x 2048 feed-forward: ~80 MB of float32 weights per checkpoint
    state = {}
    for i in range(layers):
        p = f"encoder.layer.{i}."
        for name, shape in [
            ("attention.self.query", (d, d)),
            ("attention.self.key", (d, d)),
            ("attention.self.value", (d, d)),
            ("attention.output.dense", (d, d)),
            ("intermediate.dense", (4 * d, d)),
            ("output.dense", (d, 4 * d)),
        ]:
            state[p + name + ".weight"] = torch.randn(shape, generator=gen)
    config = {
        "model_type": "bert",
        "architectures": ["BertModel"],
        "hidden_size": d,
        "num_hidden_layers": layers,
        "num_attention_heads": 8,
        "intermediate_size": 4 * d,
    }
    base = save_state(tmp_path / "base", state, config)
    tuned = save_state(
        tmp_path / "ft", {k: v + 0.01 * torch.randn(v.shape, generator=gen) for k, v in state.items()}, config
    )
    store = tmp_path / "s.duckdb"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    limited = subprocess.run(
        [sys.executable, "-c", LIMITED, str(base), str(tuned), str(store)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert limited.returncode == 0, limited.stderr[-2000:]
    why = limited.stdout.strip().splitlines()[-1]
    assert why.startswith(f"{tuned}: out of memory"), why
    with Store(store) as db:
        assert db.reads.failures()["kind"].tolist() == ["resource"]
    free = subprocess.run(
        [
            sys.executable,
            "-m",
            "modelvec.cli",
            "embed",
            "--base",
            str(base),
            str(tuned),
            "--store",
            str(store),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert free.returncode == 0, free.stderr[-2000:]
    import json

    assert json.loads(free.stdout)["embedded"] == [str(tuned)]
