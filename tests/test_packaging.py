"""Packaging: the torch the extension was built against is checked at import, the version lives
in one place, and building without torch installed (an isolated build) stops with a message."""

from __future__ import annotations

import os
import re
import subprocess
import sys

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
