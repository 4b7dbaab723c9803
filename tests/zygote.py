"""``modelvec`` commands in processes forked from one that has imported them once.

A test that runs a command as a user does starts a process for it; most of such a process's seconds are imports
(the CLI, pandas, DuckDB, torch: 1-3 s), the same in each. A :class:`Zygote` imports them once, in a process started
with the environment the commands get, and forks it for each command: each command still runs in a process of its
own (its own pid, file descriptors, exit status, a signal or a full disk met as in any process), started from a
Python that has already imported what it would import. What a fresh process alone shows, that nothing heavy is
imported before a command runs, is tested apart (``tests/cli/test_no_torch.py``).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
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
import importlib, json, os, sys, traceback
for name in json.loads(sys.argv[1]):
    try:
        importlib.import_module(name)
    except ImportError:
        pass
import modelvec.cli

replies = os.fdopen(int(sys.argv[2]), "w", buffering=1)
replies.write("ready\n")
for line in sys.stdin:
    ask = json.loads(line)
    sys.stdout.flush(); sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the command's process
        code = 1
        try:
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
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:  # its files flushed, then out at once: the interpreter's teardown of torch and the rest is ~1 s a
            try:  # command; modelvec registers no exit functions (test_hostile checks), the CLI closes its store
                sys.stdout.flush(); sys.stderr.flush()
            finally:
                os._exit(code)
    replies.write(f"{pid}\n")
    _, status = os.waitpid(pid, 0)
    replies.write(f"{os.waitstatus_to_exitcode(status)}\n")
"""


class Zygote:
    """A Python that has imported the commands (:data:`PRELOAD`), with ``env``; :meth:`run` forks it for each."""

    def __init__(self, env: Mapping[str, str], preload: Sequence[str] = PRELOAD) -> None:
        self.env = dict(env)
        read, write = os.pipe()
        self.process = subprocess.Popen(
            [sys.executable, "-c", SERVER, json.dumps(list(preload)), str(write)],
            stdin=subprocess.PIPE,
            env=self.env,
            text=True,
            pass_fds=(write,),
        )
        os.close(write)
        self.replies = os.fdopen(read, "r", buffering=1)
        assert self._reply(120) == "ready", "the zygote did not start"

    def _reply(self, timeout: float) -> str:
        ready, _, _ = select.select([self.replies], [], [], timeout)
        if not ready:
            raise TimeoutError
        return self.replies.readline().strip()

    def run(self, args: Sequence[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """``modelvec *args`` in ``cwd``, in a process forked for it: its status, stdout and stderr."""
        assert self.process.stdin is not None and self.process.poll() is None
        with tempfile.TemporaryDirectory() as folder:
            out, err = Path(folder) / "out", Path(folder) / "err"
            ask = {"args": [str(a) for a in args], "cwd": str(cwd), "out": str(out), "err": str(err)}
            self.process.stdin.write(json.dumps(ask) + "\n")
            self.process.stdin.flush()
            pid = int(self._reply(30))
            try:
                code = int(self._reply(timeout))
            except TimeoutError:
                os.kill(pid, signal.SIGKILL)
                self._reply(30)
                raise subprocess.TimeoutExpired(["modelvec", *args], timeout) from None
            stdout, stderr = out.read_text(errors="replace"), err.read_text(errors="replace")
        return subprocess.CompletedProcess(["modelvec", *args], code, stdout, stderr)

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.replies.close()
