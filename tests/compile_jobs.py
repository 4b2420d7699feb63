"""The compile tests' subprocesses (test_triton_*_ptx.py, test_triton_amd.py: each compiles the
kernels with triton's bundled compilers and prints JSON), started in the background when the
session's tests are collected (conftest.py) and read when a test needs its result: their 40 s
or so of compiling then runs on whatever CPU the other tests leave idle (most tests spend much
of their time waiting on ranks and sockets), at a lower priority so as not to slow them. A
module that lists its scripts in ``COMPILE_SCRIPTS`` gets them started; ``result`` starts a
script that was not (a module run on its own with ``-p no:...``, say) and waits for it.
Imports neither torch nor triton."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Dict, Tuple

_JOBS: Dict[Tuple[str, ...], dict] = {}


def start(script: str, *args: str) -> None:
    """Starts ``python -c script args`` without TRITON_INTERPRET, compiling into a fresh cache
    directory (whatever ~/.triton holds), at nice 10; once per (script, args)."""
    key = (script, *args)
    if key in _JOBS:
        return
    work = tempfile.mkdtemp(prefix="cgx-compile-")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    env["TRITON_CACHE_DIR"] = os.path.join(work, "cache")
    out = open(os.path.join(work, "out.json"), "w+")
    err = open(os.path.join(work, "err.txt"), "w+")
    proc = subprocess.Popen([sys.executable, "-c", script, *args], env=env, stdout=out,
                            stderr=err, preexec_fn=lambda: os.nice(10))  # fmt: skip
    _JOBS[key] = {"proc": proc, "work": work, "out": out, "err": err, "result": None}


def result(script: str, *args: str, timeout: float = 300) -> dict:
    """The JSON the script printed (started now where it was not yet), or an AssertionError
    with its stderr's tail where it failed."""
    start(script, *args)
    job = _JOBS[(script, *args)]
    if job["result"] is None:
        rc = job["proc"].wait(timeout=timeout)
        job["out"].seek(0)
        job["err"].seek(0)
        text, err = job["out"].read(), job["err"].read()
        _close(job)
        assert rc == 0, err[-3000:]
        job["result"] = json.loads(text)
    return job["result"]


def _close(job: dict) -> None:
    job["out"].close()
    job["err"].close()
    shutil.rmtree(job["work"], ignore_errors=True)


@atexit.register
def _stop_all() -> None:
    """A session that ends before reading a result (-x, an interrupt) leaves no process or
    directory behind."""
    for job in _JOBS.values():
        if job["proc"].poll() is None:
            job["proc"].kill()
            job["proc"].wait()
        if not job["out"].closed:
            _close(job)
