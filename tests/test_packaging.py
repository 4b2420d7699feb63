"""Packaging: the torch the extension was built against is checked at import, the version lives
in one place, building without torch installed (an isolated build) stops with a message, and
benchmarks/ stays outside the package (never imported by it, never in the wheel)."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest
import torch

import torch_cgx
from torch_cgx._native import check_torch_version

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_extension_matches_the_running_torch():
    assert torch_cgx._C.built_with_torch == torch.__version__.split("+")[0]
    check_torch_version("2.13.0", "2.13.0+cpu")  # local labels do not matter
    with pytest.raises(ImportError, match=r"built against torch 2\.14\.1, but torch 2\.13\.0"):
        check_torch_version("2.14.1", "2.13.0")


def test_version_in_one_place():
    text = open(os.path.join(REPO, "setup.py")).read()
    assert not re.search(r'version="\d', text), "setup.py must read torch_cgx/version.py"
    from torch_cgx.version import __version__

    assert torch_cgx.__version__ == __version__


def test_setup_without_torch_explains_no_build_isolation():
    # What an isolated build sees: no torch. sys.modules[...] = None makes `import torch` fail.
    code = (
        "import sys, runpy; sys.modules['torch'] = None; sys.argv = ['setup.py', '--version'];"
        "runpy.run_path('setup.py', run_name='__main__')"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert r.returncode != 0
    assert "--no-build-isolation" in r.stderr and "install torch first" in r.stderr


def test_benchmark_dependencies_are_an_extra():
    text = open(os.path.join(REPO, "setup.py")).read()
    assert 'install_requires=[f"torch=={TORCH_VERSION}"]' in text
    extra = re.search(r'"bench": \[([^\]]*)\]', text).group(1)
    for dep in ("numpy", "transformers", "scikit-learn", "matplotlib"):
        assert f'"{dep}"' in extra


def _imported_modules(path: str):
    """Every module a file imports, lazy imports inside functions included (``from a import b``
    yields ``a`` and ``a.b``: b may be a module)."""
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.module
            yield from (f"{node.module}.{a.name}" for a in node.names)


def _py_files(folder: str):
    for root, _, files in os.walk(os.path.join(REPO, folder)):
        yield from (os.path.join(root, f) for f in sorted(files) if f.endswith(".py"))


def test_no_package_module_imports_benchmarks():
    # Statically, so that an import inside a function that the next test never calls counts.
    offenders = [
        (os.path.relpath(path, REPO), name)
        for path in _py_files("torch_cgx")
        for name in _imported_modules(path)
        if name.split(".")[0] == "benchmarks"
    ]
    assert offenders == []
    # And at run time: torch_cgx and every submodule imported, from the repository root, where
    # benchmarks/ could be imported.
    code = (
        "import importlib, importlib.util, json, pkgutil, sys\n"
        "import torch_cgx\n"
        "names = ['torch_cgx'] + [m.name for m in pkgutil.walk_packages(torch_cgx.__path__, "
        "'torch_cgx.')]\n"
        "missing = []\n"
        "for n in names:\n"
        "    try:\n"
        "        importlib.import_module(n)\n"
        "    except ImportError as e:  # an optional dependency (e.g. lightning) not installed\n"
        "        if (e.name or '').split('.')[0] in ('torch_cgx', 'benchmarks'):\n"
        "            raise\n"
        "        missing.append(n)\n"
        "bench = [m for m in sys.modules if m.split('.')[0] == 'benchmarks']\n"
        "found = importlib.util.find_spec('benchmarks') is not None\n"
        "print(json.dumps(dict(names=names, missing=missing, bench=bench, found=found)))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.splitlines()[-1])
    assert out["found"], "benchmarks/ must be importable here, or this test proves nothing"
    assert out["bench"] == []
    imported = set(out["names"]) - set(out["missing"])
    assert {"torch_cgx.plan.costs", "torch_cgx.plan.rates", "torch_cgx.hooks"} <= imported


def test_wheel_ships_no_benchmarks(tmp_path):
    # A wheel of a copy of the sources (without the extension: CGX_SKIP_EXT=1), benchmarks/
    # included in the copy: setup.py must leave it out.
    src = tmp_path / "src"
    skip = shutil.ignore_patterns("__pycache__", "*.so", "*.egg-info")
    for name in ("torch_cgx", "cgx_utils", "benchmarks"):
        shutil.copytree(os.path.join(REPO, name), src / name, ignore=skip)
    for name in ("setup.py", "pyproject.toml"):
        shutil.copy(os.path.join(REPO, name), src / name)
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps"]
    cmd += ["-w", str(tmp_path / "out"), str(src)]
    env = dict(os.environ, CGX_SKIP_EXT="1")
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    (wheel,) = (tmp_path / "out").glob("torch_cgx-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"torch_cgx", "cgx_utils"}
    assert "torch_cgx/plan/rates.py" in names and "torch_cgx/hooks/__init__.py" in names
    assert not [n for n in names if "bench" in n or n.endswith("demo.py")]


def _runnable_benchmarks():
    return sorted(
        os.path.basename(p)[:-3]
        for p in _py_files("benchmarks")
        if 'if __name__ == "__main__":' in open(p).read() and not p.endswith("__main__.py")
    )


def test_every_benchmark_is_listed_and_runs_as_a_module():
    from benchmarks.__main__ import ENTRY_POINTS

    runnable = _runnable_benchmarks()
    assert "demo" in runnable and "hosts" in runnable and "codec" in runnable
    assert sorted(ENTRY_POINTS) == runnable
    readme = open(os.path.join(REPO, "benchmarks", "README.md")).read()
    assert [n for n in runnable if f"python -m benchmarks.{n}" not in readme] == []


def test_benchmarks_have_no_import_cycle():
    graph = {}
    for path in _py_files("benchmarks"):
        name = "benchmarks." + os.path.basename(path)[:-3]
        graph[name] = set()
        for mod in _imported_modules(path):
            if mod.startswith("benchmarks.") and os.path.exists(
                os.path.join(REPO, *mod.split(".")) + ".py"
            ):
                graph[name].add(mod)
    state = {}  # 1: on the current path, 2: done

    def visit(node, path):
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            assert state.get(nxt) != 1, "import cycle: " + " -> ".join(path + [node, nxt])
            if nxt not in state:
                visit(nxt, path + [node])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])


def test_no_two_package_modules_import_each_other():
    """No pair of torch_cgx modules (packages aside: an __init__ re-exports its modules) imports
    each other, lazily or not: one of the two holds what both need (e.g. counters.py and
    hook_stats.py: ByteCounts lives in byte_counts.py)."""
    files = {}
    for path in _py_files("torch_cgx"):
        if not path.endswith("__init__.py"):
            files[os.path.relpath(path, REPO)[:-3].replace(os.sep, ".")] = path
    graph = {
        name: {m for m in _imported_modules(path) if m in files and m != name}
        for name, path in files.items()
    }
    pairs = sorted({tuple(sorted((a, b))) for a in graph for b in graph[a] if a in graph[b]})
    assert pairs == []
