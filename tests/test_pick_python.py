"""scripts/pick-python.sh: an externally managed interpreter (PEP 668, Debian 12's /usr/bin/python3)
gets the virtual environment .venv, any other is used as it is; and the Makefile runs every target
with that choice. Fake interpreters (shell scripts that answer the picker's question) stand in for
real ones: nothing is installed."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PICK = ROOT / "scripts" / "pick-python.sh"


def fake_python(tmp_path: Path, managed: bool, in_venv: bool = False) -> Path:
    """An "interpreter" whose stdlib directory has EXTERNALLY-MANAGED or not."""
    stdlib = tmp_path / "lib" / "python3.11"
    stdlib.mkdir(parents=True)
    if managed:
        (stdlib / "EXTERNALLY-MANAGED").write_text("[externally-managed]\nError=use apt\n")
    exe = tmp_path / "bin" / "python3"
    exe.parent.mkdir()
    exe.write_text(f"#!/bin/sh\nprintf '%s\\n%s\\n' {int(in_venv)} '{stdlib}'\n")
    exe.chmod(0o755)
    return exe


def pick(py, root="/repo") -> str:
    script = f'. "{PICK}"; cgx_pick_python "$1" "$2"'
    out = subprocess.run(["bash", "-c", script, "bash", str(py), root], capture_output=True,
                         text=True, check=True)  # fmt: skip
    return out.stdout.strip()


@pytest.mark.parametrize(
    "managed, in_venv, venv",
    [(True, False, True), (False, False, False), (True, True, False)],
    ids=["externally-managed", "not-managed", "already-in-a-venv"],
)
def test_pick(tmp_path, managed, in_venv, venv):
    py = fake_python(tmp_path, managed, in_venv)
    assert pick(py) == ("/repo/.venv/bin/python" if venv else str(py))


def test_an_interpreter_that_does_not_run_is_printed_unchanged(tmp_path):
    assert pick(tmp_path / "no-such-python") == str(tmp_path / "no-such-python")


def test_the_script_run_alone_answers_for_this_repository(tmp_path):
    py = fake_python(tmp_path, managed=True)
    out = subprocess.run([str(PICK), str(py)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"{ROOT}/.venv/bin/python"


def make_dry_run(py: Path, *targets: str) -> str:
    """`make -n -B` (prints the recipes, runs none) with PY set as the README's callers set it."""
    env = dict(os.environ, PY=str(py))
    out = subprocess.run(["make", "-n", "-B", *targets], cwd=ROOT, env=env, capture_output=True,
                         text=True, check=True)  # fmt: skip
    return out.stdout


def test_every_make_target_runs_the_venv_python_for_a_managed_py(tmp_path):
    py = fake_python(tmp_path, managed=True)
    venv_py = f"{ROOT}/.venv/bin/python"
    out = make_dry_run(py, "build", "py-test", "demo", "bench", "settings-doc", "gpu-check-cpu")
    assert f"PY={py} ./scripts/install-deps.sh" in out  # install-deps makes the venv from PY
    assert "touch .venv/.stamp-deps" in out
    for line in out.splitlines():
        if "install-deps.sh" not in line:
            assert str(py) not in line, line
    for cmd in ("setup.py -q build_ext", "-m pytest tests", "-m benchmarks.demo",
                "-m benchmarks.codec", "-c \"from torch_cgx import settings"):  # fmt: skip
        assert f"{venv_py} {cmd}" in out, cmd
    assert f"PY={venv_py} scripts/offline.sh scripts/gpu_check.sh --cpu" in out
    # and .venv/bin first on the recipes' PATH (ruff, clang-format, torchrun of the venv)
    env = dict(os.environ, PY=str(py))
    path = subprocess.run(["make", "--no-print-directory", "--eval", "show-path: ; @echo $$PATH",
                           "show-path"], cwd=ROOT,
                          env=env, capture_output=True, text=True, check=True)  # fmt: skip
    assert path.stdout.split(":")[0] == f"{ROOT}/.venv/bin"


def test_make_uses_an_unmanaged_py_as_it_is(tmp_path):
    py = fake_python(tmp_path, managed=False)
    out = make_dry_run(py, "build", "py-test")
    assert f"{py} setup.py -q build_ext" in out and f"{py} -m pytest tests" in out
    assert ".venv" not in out
