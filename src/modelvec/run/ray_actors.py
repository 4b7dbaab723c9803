"""The Ray engine's actors, and the driver's side of a run over them (:mod:`modelvec.run.ray_engine` says why).

Each actor (:class:`_Worker`) reads the base once, then embeds the models sent to it one at a time; the
:class:`Dispatcher` pulls tasks only as actors have room (at most ``IN_FLIGHT`` each), starts actors as there are
tasks for them, yields outcomes as they complete, and replaces an actor that dies. A Ray error is said in one line
(:func:`one_line`) and, for :func:`modelvec.core.errors.error_of`, is the cluster's fault.
"""

from __future__ import annotations

import os
import re
import warnings
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ..core.errors import CheckpointError, Kind, ModelvecError, error_of, register_explainer
from ..hub.client import HubSettings
from ..represent.representation import Representation
from .work import BaseSpec, Outcome, Task, compute, fit_base, open_counted

if TYPE_CHECKING:
    from ..represent import DeltaEmbedder

try:
    import ray
    from ray import exceptions as _rayx
except ImportError:  # the optional extra is not installed: RayEngine() says so
    ray = None  # type: ignore[assignment]
    _rayx = None  # type: ignore[assignment]

IN_FLIGHT = 2  # tasks per actor: one running, the next one already sent
STALL_SECONDS = 60.0  # warn when no actor has started after this long (the cluster may lack the resources)
FORWARDED_ENV = ("HF_ENDPOINT", "HF_HUB_OFFLINE")  # where the driver resolved the Hub revisions


def _deaths() -> tuple[type[BaseException], ...]:
    """The Ray errors that mean the worker (or its node) is gone, not that the model failed."""
    return (
        _rayx.RayActorError,
        _rayx.WorkerCrashedError,
        _rayx.NodeDiedError,
        _rayx.OutOfMemoryError,
        _rayx.LocalRayletDiedError,
        _rayx.ObjectLostError,
    )


def one_line(exc: BaseException) -> str:
    """A Ray error in one line: the worker's exit detail, the creation error's last line, or the first line."""
    text = str(exc)
    detail = re.search(r"Worker exit detail: ([^\n]+?\.)(\s|$)", text)  # its first sentence: the rest is advice
    if detail:
        return detail.group(1).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    if getattr(exc, "actor_init_failed", False):
        return lines[-1]  # the creation task's traceback ends with the exception
    return lines[0]


def _explain(exc: BaseException) -> tuple[Kind, str] | None:
    """For :func:`modelvec.core.errors.error_of`: a Ray failure is the cluster's (resource when it ran out of memory)."""
    if _rayx is None or not isinstance(exc, _rayx.RayError):
        return None
    return (Kind.RESOURCE if isinstance(exc, _rayx.OutOfMemoryError) else Kind.TRANSIENT), one_line(exc)


register_explainer(_explain)


class _Worker:
    """A Ray actor: reads the base once, then embeds the models sent to it, one at a time."""

    def __init__(
        self, base: BaseSpec, representation: Representation, device: str, hub_settings: HubSettings, keep_weights: bool
    ) -> None:
        import torch

        torch.set_num_threads(1)  # one actor per CPU
        self.hub_settings = hub_settings
        self.keep_weights = keep_weights
        self.embedder: DeltaEmbedder | None = None
        self.failure: str | None = None
        try:
            self.embedder = fit_base(base, representation, device, hub_settings)
        except ModelvecError as exc:  # kept, not raised: the driver tells this from a dead worker
            self.failure = exc.cause if exc.model == base.name else str(exc)
        except Exception as exc:
            self.failure = error_of(exc, base.name).cause

    def ready(self) -> str | None:
        """None once the base is read; else why it could not be opened here."""
        return self.failure

    def run(self, task: Task) -> Outcome | ModelvecError:
        """One model's outcome (its Hub files deleted afterwards unless ``keep_weights``).

        A fault of the base is returned, not raised, so the driver tells it from a dead worker.
        """
        embedder = self.embedder
        assert embedder is not None, "run() on a worker whose base failed"
        try:
            return compute(
                task,
                embedder,
                lambda: open_counted(task, self.hub_settings, embedder.representation),
                self.hub_settings,
            )
        except ModelvecError as exc:  # compute raises only the base's own faults
            return exc
        finally:
            if not self.keep_weights:
                task.release(self.hub_settings)


class Cluster(Protocol):
    """What the dispatcher asks of its engine (:class:`~modelvec.run.ray_engine.RayEngine`): how many actors, on
    which device."""

    device: str

    @property
    def gpu(self) -> bool: ...

    def size(self) -> int: ...


@dataclass(eq=False)
class _Slot:
    """One actor as the driver sees it: started (ready) or not, and its tasks in submission order."""

    actor: Any
    started: Any  # the ObjectRef of its ready() call
    ready: bool = False
    inflight: deque[tuple[Any, Task]] = field(default_factory=deque)


class Dispatcher:
    """One run's actors and tasks: pulls tasks as actors have room, collects outcomes, replaces dead actors."""

    def __init__(
        self,
        engine: Cluster,
        base: BaseSpec,
        representation: Representation,
        hub_settings: HubSettings,
        keep_weights: bool,
        todo: Iterator[Task],
    ) -> None:
        self.base = base
        self.todo = todo
        self.exhausted = False
        self.size = engine.size()
        env = {name: os.environ[name] for name in FORWARDED_ENV if name in os.environ}
        options: dict[str, Any] = {"num_cpus": 1, "max_restarts": 0}
        if engine.gpu:
            options["num_gpus"] = 1
        if env:
            options["runtime_env"] = {"env_vars": env}
        # Ray sets CUDA_VISIBLE_DEVICES to the actor's one GPU, so it is always "cuda" there.
        device = "cuda" if engine.gpu else engine.device
        self.actor_class = ray.remote(_Worker).options(**options)
        self.args = (base, representation, device, hub_settings, keep_weights)
        self.asked = "1 CPU and 1 GPU" if engine.gpu else "1 CPU"
        self.slots: list[_Slot] = []
        self.starting: dict[Any, _Slot] = {}  # ready() ref -> slot
        self.running: dict[Any, tuple[_Slot, Task]] = {}  # run() ref -> slot, task
        self.backlog: deque[Task] = deque()  # pulled (or given back by a dead actor), not yet sent
        self.deaths_starting = 0
        self.warned = False

    def outcomes(self) -> Iterator[Outcome]:
        try:
            while True:
                self._fill()
                if self.exhausted and not self.backlog and not self.running:
                    return
                waiting = list(self.running) + list(self.starting)
                any_ready = any(slot.ready for slot in self.slots)
                done, _ = ray.wait(waiting, num_returns=1, timeout=None if any_ready or self.warned else STALL_SECONDS)
                if not done:
                    self.warned = True
                    warnings.warn(
                        f"no Ray worker has started after {STALL_SECONDS:.0f} s: does the cluster have the "
                        f"resources asked for ({self.asked} per worker)?",
                        stacklevel=2,
                    )
                    continue
                ref = done[0]
                if ref in self.starting:
                    self._started(ref)
                else:
                    yield from self._finished(ref)
        finally:
            self._close()

    def _fill(self) -> None:
        """Pull tasks (at most IN_FLIGHT per actor waiting or running), start actors, send tasks to ready ones."""
        while True:
            while not self.exhausted and len(self.backlog) + len(self.running) < IN_FLIGHT * max(1, len(self.slots)):
                task = next(self.todo, None)
                if task is None:
                    self.exhausted = True
                else:
                    self.backlog.append(task)
            if len(self.slots) < self.size and len(self.backlog) > len(self.starting):
                self._start()  # one actor more while more tasks wait than actors are starting
                continue
            free = [slot for slot in self.slots if slot.ready and len(slot.inflight) < IN_FLIGHT]
            if not free or not self.backlog:
                return
            slot = min(free, key=lambda s: len(s.inflight))
            task = self.backlog.popleft()
            ref = slot.actor.run.remote(task)
            slot.inflight.append((ref, task))
            self.running[ref] = (slot, task)

    def _start(self) -> None:
        actor = self.actor_class.remote(*self.args)
        slot = _Slot(actor, actor.ready.remote())  # type: ignore[attr-defined]  # a Ray actor method
        self.slots.append(slot)
        self.starting[slot.started] = slot

    def _started(self, ref: Any) -> None:
        slot = self.starting.pop(ref)
        try:
            failure = ray.get(ref)
        except _rayx.RayError as exc:
            if getattr(exc, "actor_init_failed", False) or not isinstance(exc, _deaths()):
                # not the base (its faults are caught in __init__): the worker cannot run modelvec at all
                raise ValueError(
                    f"a Ray worker cannot start: {one_line(exc)} (is modelvec[ray] installed on every "
                    "node, with the driver's versions?)"
                ) from None
            self._forget(slot)
            self.deaths_starting += 1
            if self.deaths_starting > self.size:
                raise CheckpointError(
                    self.base.name,
                    "cannot be opened on a Ray worker: the worker died reading it "
                    f"({self.deaths_starting} times): {one_line(exc)}",
                ) from None
            return
        if failure is not None:
            raise CheckpointError(self.base.name, f"cannot be opened on a Ray worker: {failure}")
        slot.ready = True

    def _finished(self, ref: Any) -> Iterator[Outcome]:
        slot, task = self.running.pop(ref)
        try:
            result = ray.get(ref)
        except _deaths():
            yield from self._died(slot)
            return
        except _rayx.RayError as exc:  # e.g. the task could not be unpickled there: this model's failure
            slot.inflight.remove((ref, task))
            err = error_of(exc, task.name)
            yield Outcome(task=task, error=f"{task.name}: Ray: {err.cause}", kind=err.kind)
            return
        slot.inflight.remove((ref, task))
        yield self._outcome(result)

    def _died(self, slot: _Slot) -> Iterator[Outcome]:
        """A dead actor: outcomes it finished stand, the one it was running fails, the ones queued behind go back."""
        self._forget(slot)
        blamed = False
        queued: list[Task] = []
        for ref, task in slot.inflight:  # submission order: the actor ran them one after another
            self.running.pop(ref, None)
            if blamed:
                queued.append(task)
                continue
            try:
                result = ray.get(ref)
            except _rayx.RayError as exc:
                blamed = True
                err = error_of(exc, task.name)
                yield Outcome(task=task, error=f"{task.name}: the Ray worker died: {err.cause}", kind=err.kind)
                continue
            yield self._outcome(result)
        slot.inflight.clear()
        self.backlog.extendleft(reversed(queued))  # sent first to the other actors

    def _outcome(self, result: Outcome | ModelvecError) -> Outcome:
        if isinstance(result, ModelvecError):
            raise result
        if result.vector is not None:  # a copy: the one from ray.get is read-only and pins the object store
            result.vector = np.array(result.vector, copy=True)
        return result

    def _forget(self, slot: _Slot) -> None:
        if slot in self.slots:
            self.slots.remove(slot)
        self.starting.pop(slot.started, None)
        try:
            ray.kill(slot.actor)
        except Exception:  # already gone
            pass

    def _close(self) -> None:
        """Cancel what is still running (an interrupt, an error) and let the actors go."""
        for ref in list(self.running):
            try:
                ray.cancel(ref)
            except Exception:
                pass
        for slot in list(self.slots):
            self._forget(slot)
        self.running.clear()
        self.starting.clear()
