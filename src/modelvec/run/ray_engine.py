"""The Ray engine: the same per-model work as the local engine, run by actors on a Ray cluster.

* **Actors, not plain tasks**: a plain task would read the base once per model. Each actor reads it once
  (:func:`~modelvec.run.work.fit_base`), then embeds the models sent to it with the local engine's
  :func:`~modelvec.run.work.compute`, so a vector does not depend on where it was computed. An actor takes one CPU
  (``torch`` one thread) or, with ``device="cuda"``, one GPU; by default one per CPU (GPU) of the cluster, started
  only as there are models for them.
* **The driver keeps the store**: a worker returns its :class:`~modelvec.run.work.Outcome` (the vector, the labels,
  or the one-line reason it failed) and the driver (:mod:`modelvec.run.pipeline`) writes it, so only the driver
  needs the store file and an interrupted run keeps what was written.
* **Backpressure**: tasks are pulled from the driver's iterator only as actors have room, at most ``IN_FLIGHT`` per
  actor, so a run over 100k models never submits them all; outcomes come back as they complete, in any order.
* **Faults**: a model's own faults are its outcome's error. An actor that dies (killed, out of memory, node lost)
  fails the model it was running with "the Ray worker died" (retried next run); the models queued behind it go to
  other actors and the actor is replaced. A base that cannot be opened on a worker stops the run with a
  :class:`~modelvec.core.errors.CheckpointError` naming it. On an interrupt, in-flight tasks are cancelled and the
  actors killed.

Local paths (the base, local models) are opened by the workers: the same path on every node (a shared filesystem).
Hub models are fetched by each worker into its node's Hugging Face cache (``HF_TOKEN`` or ``hf auth login`` there for
private or gated models); the driver's ``HF_ENDPOINT`` and ``HF_HUB_OFFLINE`` are passed on. Install modelvec
(``pip install 'modelvec[ray]'``) on every node, with the driver's Python and torch versions. How to start a
cluster, and what was measured on one: docs/scale.md.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from ..hub.client import HubSettings
from ..represent.representation import Representation
from .ray_actors import Dispatcher, one_line
from .work import BaseSpec, Outcome, Task

try:
    import ray
except ImportError:  # the optional extra is not installed: RayEngine() says so
    ray = None  # type: ignore[assignment]

MISSING = "the ray engine needs the optional extra: pip install 'modelvec[ray]'"


class RayEngine:
    """A Ray cluster: ``workers`` actors (default: one per CPU, or per GPU with ``device="cuda"``).

    ``address`` is the cluster's (``HEAD:6379``, ``auto``); ``None`` connects to a cluster started
    on this machine (``ray start``, or ``RAY_ADDRESS``) or else starts a local one for the run.
    When Ray is already initialised in this process, that connection is used and left open.
    """

    def __init__(self, workers: int | None = None, device: str = "cpu", address: str | None = None) -> None:
        if ray is None:
            raise ValueError(MISSING)
        if workers is not None and (not isinstance(workers, int) or isinstance(workers, bool) or workers < 1):
            raise ValueError(f"workers must be an integer >= 1, not {workers!r}")
        if address is not None and (not isinstance(address, str) or not address.strip()):
            raise ValueError(f"address must be HOST:PORT or auto, not {address!r}")
        self.workers = workers
        self.device = device
        self.address = address

    @classmethod
    def from_options(cls, workers: int | None, device: str, address: str | None = None) -> RayEngine:
        """The engine of ``--engine ray``: one actor per CPU (GPU) unless ``workers`` says otherwise."""
        return cls(workers, device, address)

    @property
    def gpu(self) -> bool:
        return str(self.device).startswith("cuda")

    def run(
        self,
        base: BaseSpec,
        representation: Representation,
        tasks: Iterable[Task],
        hub_settings: HubSettings,
        keep_weights: bool = True,
    ) -> Iterator[Outcome]:
        """Outcomes as they complete, in any order. Ray is not touched until the first task arrives."""
        todo = iter(tasks)
        first = next(todo, None)
        if first is None:  # everything was stored or failed before: no cluster, no base
            return
        with connected(self.address):
            yield from Dispatcher(
                self, base, representation, hub_settings, keep_weights, _chain(first, todo)
            ).outcomes()

    def size(self) -> int:
        """How many actors at most: ``workers``, or one per CPU (GPU) of the cluster now."""
        if self.workers is not None:
            return self.workers
        resources = ray.cluster_resources()
        if self.gpu:
            gpus = int(resources.get("GPU", 0))
            if gpus < 1:
                raise ValueError(f"device {self.device}: the Ray cluster has no GPUs")
            return gpus
        return max(1, int(resources.get("CPU", 1)))


@contextmanager
def connected(address: str | None) -> Iterator[None]:
    """Ray connected for what runs inside: to the cluster at ``address`` (``None``: one started on this machine, or a
    local one started for the run, shut down after it); a connection this process already has is used and left
    open. A cluster that cannot be started or reached is a ValueError in one line."""
    if ray is None:
        raise ValueError(MISSING)
    started = not ray.is_initialized()
    if started:
        try:
            ray.init(address=address, include_dashboard=False, log_to_driver=False)
        except Exception as exc:
            where = f"at {address}" if address else "here"
            hint = ""
            if address not in (None, "auto", "local") and "RAY_AUTH_MODE" not in os.environ:
                hint = (
                    " (a cluster started by `ray start` uses token authentication: set RAY_AUTH_MODE=token and "
                    "its token, RAY_AUTH_TOKEN or ~/.ray/auth_token, here)"
                )
            raise ValueError(f"cannot start or reach the Ray cluster {where}: {one_line(exc)}{hint}") from None
    try:
        yield
    finally:
        if started:
            ray.shutdown()


def _chain(first: Task, rest: Iterator[Task]) -> Iterator[Task]:
    yield first
    yield from rest
