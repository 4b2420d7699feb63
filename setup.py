"""Builds torch_cgx._C against the installed torch (pip install --no-build-isolation -e .)."""

import glob
import os
import re

from setuptools import find_packages, setup

try:
    import torch
    from torch.utils.cpp_extension import BuildExtension, CppExtension
except ImportError:
    raise SystemExit(
        "torch_cgx builds against the torch already installed (its C++ ABI is not stable): "
        "install torch first, then `pip install --no-build-isolation .` (with build isolation "
        "pip would build against a different, freshly downloaded torch)"
    ) from None

os.environ.setdefault("MAX_JOBS", "2")

with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_cgx", "version.py")) as f:
    VERSION = re.search(r'__version__ = "([^"]+)"', f.read()).group(1)
TORCH_VERSION = torch.__version__.split("+")[0]

sources = sorted(glob.glob("csrc/core/*.cc") + glob.glob("csrc/compressors/*.cc"))
sources += sorted(glob.glob("csrc/algorithms/*.cc"))
sources += sorted(glob.glob("csrc/torch/*.cc"))

# CGX_SKIP_EXT=1: register the package (pip install -e) without building; `make build` builds
# the extension in place with ninja, incrementally.
ext_modules = []
if os.environ.get("CGX_SKIP_EXT") != "1":
    ext_modules.append(
        CppExtension(
            "torch_cgx._C",
            sources,
            include_dirs=[os.path.abspath("csrc")],
            define_macros=[("CGX_BUILT_WITH_TORCH", f'"{TORCH_VERSION}"')],
            # -g1 (after Python's -g): line tables for backtraces, without the full debug
            # information of torch's templates, which doubled each binding's compile time
            # (backend_binding.cc 38 s -> 22 s on the 2-core machine; objects 19 MB -> 5 MB)
            extra_compile_args=[
                "-O3",
                "-g1",
                "-Wall",
                "-Wextra",
                "-Wno-psabi",
                "-Wno-unused-parameter",
                "-ffp-contract=off",
            ],
        )
    )

setup(
    name="torch_cgx",
    version=VERSION,
    description="Compressed allreduce for torch.distributed: the cgx backend, hooks, compressors",
    # benchmarks/ (the benchmarks, the demo, the emulated-hosts harness) is not shipped: it
    # runs from a checkout (python -m benchmarks.<name>), and nothing in torch_cgx imports it.
    packages=find_packages(include=["torch_cgx", "torch_cgx.*", "cgx_utils"]),
    ext_modules=ext_modules,
    cmdclass={"build_ext": BuildExtension},
    python_requires=">=3.9",
    # The extension only loads with the torch it was built against (checked at import).
    install_requires=[f"torch=={TORCH_VERSION}"],
    extras_require={
        # what benchmarks/ needs beyond torch (python -m benchmarks.train, its plots), from a
        # checkout: pip install --no-build-isolation -e ".[bench]"
        "bench": ["numpy", "transformers", "scikit-learn", "matplotlib"],
    },
)
