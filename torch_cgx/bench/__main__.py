"""Dispatcher: ``python -m torch_cgx.bench <subcommand> [args]``.

Each subcommand is a module with a ``main(argv)`` function; only the chosen one is imported. To add
a subcommand, add one line to ``SUBCOMMANDS``.
"""

from __future__ import annotations

import importlib
import sys
from typing import List

SUBCOMMANDS = {
    "codec": "torch_cgx.bench.codec",
    "allreduce": "torch_cgx.bench.allreduce",
    "train": "torch_cgx.bench.train",
    "hosts": "torch_cgx.bench.hosts",
}


def usage() -> str:
    names = ", ".join(sorted(SUBCOMMANDS))
    return (
        "usage: python -m torch_cgx.bench <subcommand> [args]\n"
        f"subcommands: {names}\n"
        "run `python -m torch_cgx.bench <subcommand> --help` for a subcommand's options"
    )


def main(argv: List[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(f"unknown subcommand {name!r}\n{usage()}", file=sys.stderr)
        return 2
    module_path = SUBCOMMANDS[name]
    try:
        module = importlib.import_module(module_path)
    except ModuleNotFoundError as e:
        if e.name != module_path:
            raise  # a missing dependency inside the module, not the module itself
        print(
            f"subcommand {name!r} is registered but its module {module_path} does not exist yet",
            file=sys.stderr,
        )
        return 2
    rc = module.main(rest)
    return 0 if rc is None else int(rc)


if __name__ == "__main__":
    sys.exit(main())
