"""Engines: where the per-model work runs, picked by name through a registry.

Each engine takes the base, the representation and a stream of :class:`~modelvec.run.work.Task`
and yields one :class:`~modelvec.run.work.Outcome` per task (:class:`Engine`). The registry names
each engine's class as ``"module:Class"``, imported only when that engine is asked for, so no
engine imports another and an optional dependency (Ray) is imported only when used. Adding an
engine is :func:`register_engine`.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

from ..core.settings import setting, validate
from ..hub.client import HubSettings
from ..represent.representation import Representation
from .work import BaseSpec, Outcome, Task


class Engine(Protocol):
    """What the pipeline asks of an engine."""

    def run(
        self,
        base: BaseSpec,
        representation: Representation,
        tasks: Iterable[Task],
        hub_settings: HubSettings,
        keep_weights: bool = True,
    ) -> Iterator[Outcome]:
        """One outcome per task, as they complete; the base is read only when a task arrives."""
        ...


#: name -> "module:Class"; the class is called with (workers, device, address).
ENGINES: dict[str, str] = {
    "local": "modelvec.run.local:LocalEngine",
    "ray": "modelvec.run.ray_engine:RayEngine",
}


def register_engine(name: str, target: str) -> None:
    """Make ``--engine NAME`` build the class ``target`` (``"module:Class"``)."""
    ENGINES[name] = target


@dataclass(frozen=True)
class Execution:
    """Where and how a run computes, each setting declared once (``embed``'s options are made from them): validated
    once, passed whole."""

    engine: str = setting(
        "local",
        "Where the models are computed: local (threads here) or ray (a Ray cluster; pip install 'modelvec[ray]'); "
        "or an engine registered by register_engine.",
        choices=lambda: tuple(ENGINES),
    )
    workers: int | None = setting(
        None,
        "local: I/O threads fetching the next models (default 2); ray: actors (default one per CPU of the cluster).",
        kind=int,
        minimum=1,
        metavar="N",
    )
    address: str | None = setting(
        None, "--engine ray: the cluster (HEAD:6379 or auto); default a local one.", kind=str, metavar="HOST:PORT"
    )
    device: str = setting(
        "auto",
        "torch device: auto (CUDA where a GPU is visible and each delta is decomposed whole, as the SVD factors "
        "are; a sketch of a few rows runs faster on the CPU), cpu, cuda, cuda:N.",
        metavar="DEVICE",
    )
    keep_weights: bool = setting(
        True, "Keep Hub fine-tunes' files in the cache after embedding (the base always stays)."
    )
    products_from: int = setting(
        1000,
        "From this many vectors of the base, keep their pairwise products beside the store as they come, so the "
        "first cluster reads them instead of computing them (0: never).",
        minimum=0,
        metavar="N",
    )

    def __post_init__(self) -> None:
        validate(self)
        if self.device not in ("auto", "cpu"):  # CUDA asked for without a GPU: said before any work starts
            from ..represent import resolve_device

            resolve_device(self.device)


def make_engine(execution: Execution) -> Engine:
    """The engine ``execution`` names, built with its workers, device and address (a registered class's
    ``from_options``)."""
    module, _, cls = ENGINES[execution.engine].partition(":")
    built: Engine = getattr(importlib.import_module(module), cls).from_options(
        execution.workers, execution.device, execution.address
    )
    return built
