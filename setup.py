"""Builds torch_cgx._C against the installed torch (pip install --no-build-isolation -e .)."""

import glob
import os

from setuptools import find_packages, setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

os.environ.setdefault("MAX_JOBS", "2")

sources = sorted(glob.glob("csrc/core/*.cc") + glob.glob("csrc/algorithms/*.cc"))
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
            extra_compile_args=[
                "-O3",
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
    version="0.1.0",
    description="Compressed allreduce for torch.distributed: the cgx backend, hooks, compressors",
    packages=find_packages(include=["torch_cgx", "torch_cgx.*", "cgx_utils"]),
    ext_modules=ext_modules,
    cmdclass={"build_ext": BuildExtension},
    python_requires=">=3.9",
)
