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
from typing import Protocol

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
        settings: HubSettings,
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


def make_engine(engine: str, workers: int | None, device: str, address: str | None = None) -> Engine:
    """The engine named on the command line: ``local`` (threads here) or ``ray`` (a Ray cluster)."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be {' or '.join(ENGINES)}, not {engine!r}")
    module, _, cls = ENGINES[engine].partition(":")
    built: Engine = getattr(importlib.import_module(module), cls).from_options(workers, device, address)
    return built
