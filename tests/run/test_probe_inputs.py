"""The base's probe inputs kept beside the store: made once, read again where they verify, made again when the base
or the probe text changes or the file is damaged, never trusted then."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import modelvec
from builders import write_tiny_tokenizer
from modelvec.represent import probe as probe_module
from modelvec.store.derived.inputs import inputs_meta, inputs_path, read_inputs
from modelvec.store.formats.cachefile import read_cache_file

pytest.importorskip("transformers")
TOKENS = 16


@pytest.fixture
def family(llama_family, tmp_path):
    base, a, b, _ = llama_family
    shutil.copytree(base, tmp_path / "base")
    write_tiny_tokenizer(tmp_path / "base")
    return tmp_path / "base", a, b


@pytest.fixture
def computed(monkeypatch):
    """How many times the inputs were computed."""
    calls = []
    real = probe_module.compute_inputs

    def counting(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(probe_module, "compute_inputs", counting)
    return calls


def _meta(path, **changed):
    """What the kept file at ``path`` was made for (the base as the store names it, its version), ``changed``."""
    meta = read_cache_file(path).meta
    return inputs_meta(**{"base": meta["base"], "version": meta["base_version"], "tokens": TOKENS, **changed})


def _embed(base, models, store, **kw):
    return modelvec.embed(base, models, store=store, probe=TOKENS, **kw)


def test_made_once_then_read(family, tmp_path, computed):
    base, a, b = family
    store = tmp_path / "s.duckdb"
    first = _embed(base, [a], store)
    kept = list((tmp_path / "s.duckdb.products").glob("*.probe.kept"))
    assert len(kept) == 1 and len(computed) == 1
    second = _embed(base, [b], store)
    assert len(computed) == 1  # read, verified, not made again
    assert not second.failed and not first.failed
    again = _embed(base, [a], tmp_path / "other.duckdb")  # made anew for another store: the same vector
    np.testing.assert_array_equal(again.vectors, first.vectors)


def test_damaged_file_is_made_again(family, tmp_path, computed):
    base, a, b = family
    store = tmp_path / "s.duckdb"
    first = _embed(base, [a], store)
    (path,) = (tmp_path / "s.duckdb.products").glob("*.probe.kept")
    meta = _meta(path)
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF  # a float of the last array
    path.write_bytes(bytes(data))
    assert read_inputs(path, meta) == (None, "1 arrays do not match their checksums")
    redo = _embed(base, [a], store, force=True)
    assert len(computed) == 2
    np.testing.assert_array_equal(redo.vectors, first.vectors)  # the damaged values were never used
    assert read_inputs(path, meta)[0] is not None  # and the file was replaced by a good one


def test_made_again_for_another_base_version_or_probe(family, tmp_path, computed, monkeypatch):
    base, a, _ = family
    store = tmp_path / "s.duckdb"
    first = _embed(base, [a], store)
    (path,) = (tmp_path / "s.duckdb.products").glob("*.probe.kept")
    assert path == inputs_path(store, read_cache_file(path).meta["base"], TOKENS)
    meta = _meta(path)
    assert read_inputs(path, meta)[0] is not None
    inputs, why = read_inputs(path, _meta(path, version="another"))
    assert inputs is None and why == "computed for another base_version"
    monkeypatch.setattr(probe_module, "probe_text", lambda: "An entirely different probe text. " * 20)
    inputs, why = read_inputs(path, _meta(path))
    assert inputs is None and why == "computed for another text"
    other = _embed(base, [a], store, force=True)
    assert len(computed) == 2
    assert not np.allclose(other.vectors, first.vectors)  # another probe, another vector


def test_a_hub_base_runs_from_its_whole_files_and_gives_the_local_vectors(family, tmp_path):
    from modelvec.hub.client import HubSettings
    from modelvec.testing.localhub import LocalHub

    base, a, b = family
    hub = LocalHub(tmp_path / "hub")
    files = lambda folder: {p.name: p for p in folder.iterdir() if p.is_file()}
    hub.publish("org/base", files(base))
    hub.publish("u/a", files(a))
    hub.publish("u/b", files(b))
    local = _embed(base, [a, b], tmp_path / "local.duckdb")
    with hub.serve() as server:
        settings = HubSettings(endpoint=server.endpoint, cache_dir=str(tmp_path / "hf"), token=False, backoff=0.01)
        got = _embed("org/base", ["u/a", "u/b"], tmp_path / "s.duckdb", hub_settings=settings)
    assert sorted(got.embedded) == ["u/a", "u/b"]
    np.testing.assert_allclose(got.vectors, local.vectors, rtol=1e-6, atol=1e-7)
    assert list((tmp_path / "s.duckdb.products").glob("*.probe.kept"))
