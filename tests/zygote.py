"""``modelvec`` commands in processes forked from one that has imported them once.

A test that runs a command as a user does starts a process for it; most of such a process's seconds are imports
(the CLI, pandas, DuckDB, torch: 1-3 s), the same in each. A :class:`Zygote` imports them once, in a process started
with the environment the commands get, and forks it for each command: each command still runs in a process of its
own (its own pid, file descriptors, exit status, a signal or a full disk met as in any process), started from a
Python that has already imported what it would import. Commands may run at once (:meth:`Zygote.start`), be
signalled (SIGKILL, or SIGINT as Ctrl-C: a command's process takes it as a fresh Python does) and are reaped by the
zygote, which tells their exit status. What a fresh process alone shows, that nothing heavy is imported before a
command runs, or a kill while a command still imports, is tested apart (``tests/cli/test_no_torch.py``, the first
kill of ``tests/store/test_faults_store.py``).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

#: What the commands import when they run (a library that is not installed is left to the command).
PRELOAD = (
    "modelvec.cli",
    "torch",
    "safetensors.torch",
    "sklearn.cluster",
    "sklearn.metrics",
    "matplotlib.figure",
    "matplotlib.backends.backend_agg",
    "plotly.graph_objects",
    "pyarrow.parquet",
)

SERVER = r"""
import importlib, json, os, select, signal, sys, traceback
for name in json.loads(sys.argv[1]):
    try:
        importlib.import_module(name)
    except ImportError:
        pass
import modelvec.cli

replies = os.fdopen(int(sys.argv[2]), "w", buffering=1)
wake_r, wake_w = os.pipe()
os.set_blocking(wake_w, False)
signal.signal(signal.SIGCHLD, lambda *_: None)  # a Python handler, so that the wake-up fd is written
signal.set_wakeup_fd(wake_w)


def command(ask):  # the command's process: never returns
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C as a fresh Python takes it
        os.close(wake_r); os.close(wake_w)
        replies.close()
        os.chdir(ask["cwd"])
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        for fd, path in ((1, ask["out"]), (2, ask["err"])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
        sys.argv = ["modelvec", *ask["args"]]
        try:
            modelvec.cli.main()
            code = 0
        except SystemExit as exc:  # as the interpreter turns it into a status
            if exc.code is None or isinstance(exc.code, int):
                code = exc.code or 0
            else:
                print(exc.code, file=sys.stderr)
        except KeyboardInterrupt:  # as the interpreter ends on one
            code = 128 + signal.SIGINT
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:  # its files flushed, then out at once: the interpreter's teardown of torch and the rest is ~1 s a
        try:  # command; modelvec registers no exit functions (test_hostile checks), the CLI closes its store
            sys.stdout.flush(); sys.stderr.flush()
        finally:
            os._exit(code)


def reap():
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        replies.write(f"exit {pid} {os.waitstatus_to_exitcode(status)}\n")


replies.write("ready\n")
pending = b""
while True:
    ready, _, _ = select.select([0, wake_r], [], [])
    if wake_r in ready:
        os.read(wake_r, 4096)
        reap()
    if 0 not in ready:
        continue
    chunk = os.read(0, 65536)
    if not chunk:
        break
    pending += chunk
    while b"\n" in pending:
        line, pending = pending.split(b"\n", 1)
        sys.stdout.flush(); sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            command(json.loads(line))
        replies.write(f"pid {pid}\n")
reap()
"""


class Forked:
    """A command running in a process forked by a :class:`Zygote`: like ``subprocess.Popen``, its ``pid``,
    :meth:`poll`, :meth:`wait`, and once it ended its stdout and stderr (:meth:`outputs`)."""

    def __init__(self, zygote: Zygote, pid: int, args: Sequence[str], folder: tempfile.TemporaryDirectory) -> None:
        self.zygote, self.pid, self.args, self._folder = zygote, pid, list(args), folder
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.zygote._read(0)
            self.returncode = self.zygote.ended.pop(self.pid, None)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(["modelvec", *self.args], timeout or 0)
            self.zygote._read(left)
        assert self.returncode is not None
        return self.returncode

    def outputs(self) -> tuple[str, str]:
        """Its stdout and stderr (once it ended); its files are removed."""
        folder = Path(self._folder.name)
        out = (folder / "out").read_text(errors="replace"), (folder / "err").read_text(errors="replace")
        self._folder.cleanup()
        return out

    def completed(self, timeout: float | None = None) -> subprocess.CompletedProcess[str]:
        """Wait for it (killed after ``timeout``: TimeoutExpired), as ``subprocess.run`` answers."""
        try:
            code = self.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(self.pid, signal.SIGKILL)
            self.wait(30)
            self.outputs()
            raise
        stdout, stderr = self.outputs()
        return subprocess.CompletedProcess(["modelvec", *self.args], code, stdout, stderr)


class Zygote:
    """A Python that has imported the commands (:data:`PRELOAD`), with ``env``; :meth:`start` (or :meth:`run`) forks
    it for each."""

    def __init__(self, env: Mapping[str, str], preload: Sequence[str] = PRELOAD) -> None:
        self.env = dict(env)
        self.ended: dict[int, int] = {}  # pid -> exit status, of commands not yet asked
        self._forked: list[int] = []  # pids told, not yet taken by start
        self._ready = False
        self._pending = b""
        read, write = os.pipe()
        self.process = subprocess.Popen(
            [sys.executable, "-c", SERVER, json.dumps(list(preload)), str(write)],
            stdin=subprocess.PIPE,
            env=self.env,
            text=True,
            pass_fds=(write,),
        )
        os.close(write)
        self._replies = read
        deadline = time.monotonic() + 120
        while not self._ready and time.monotonic() < deadline:
            self._read(max(0.0, deadline - time.monotonic()))
        assert self._ready, "the zygote did not start"

    def _read(self, timeout: float | None) -> None:
        """Take the zygote's replies that come within ``timeout`` seconds (0: those already there)."""
        ready, _, _ = select.select([self._replies], [], [], timeout)
        if ready:
            chunk = os.read(self._replies, 65536)
            if not chunk:
                raise RuntimeError("the zygote ended")
            self._pending += chunk
        while b"\n" in self._pending:
            line, self._pending = self._pending.split(b"\n", 1)
            word, *rest = line.decode().split()
            if word == "ready":
                self._ready = True
            elif word == "pid":
                self._forked.append(int(rest[0]))
            else:
                self.ended[int(rest[0])] = int(rest[1])

    def start(self, args: Sequence[str], cwd: Path) -> Forked:
        """``modelvec *args`` in ``cwd``, in a process forked for it, running while this returns."""
        assert self.process.stdin is not None and self.process.poll() is None
        folder = tempfile.TemporaryDirectory()
        out, err = Path(folder.name) / "out", Path(folder.name) / "err"
        ask = {"args": [str(a) for a in args], "cwd": str(cwd), "out": str(out), "err": str(err)}
        self.process.stdin.write(json.dumps(ask) + "\n")
        self.process.stdin.flush()
        deadline = time.monotonic() + 30
        while not self._forked:
            if time.monotonic() > deadline:
                raise TimeoutError("the zygote did not fork")
            self._read(1)
        return Forked(self, self._forked.pop(0), [str(a) for a in args], folder)

    def run(self, args: Sequence[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """``modelvec *args`` in ``cwd``, in a process forked for it: its status, stdout and stderr."""
        return self.start(args, cwd).completed(timeout)

    def __enter__(self) -> Zygote:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
        os.close(self._replies)
