"""The README's layout matches the tree, and every relative link in the README and docs/ points at
a file that exists (the reference tables moved into docs/; links must follow)."""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _layout() -> str:
    text = (ROOT / "README.md").read_text()
    return text.split("## Layout", 1)[1].split("```", 2)[1]


def test_layout_names_every_folder_and_module():
    layout = _layout()
    folders = [p for p in ("torch_cgx", "cgx_utils", "benchmarks", "tests", "docs", "scripts")]
    folders += [f"csrc/{d.name}" for d in (ROOT / "csrc").iterdir() if d.is_dir()]
    folders += [f"{d.name}/" for d in (ROOT / "torch_cgx").iterdir()
                if d.is_dir() and not d.name.startswith("_")]  # fmt: skip
    missing = [f for f in folders if f not in layout]
    assert not missing, f"README's layout omits {missing}"
    modules = [p.name for p in (ROOT / "torch_cgx").glob("*.py")
               if not p.name.startswith("_") and p.name != "version.py"]  # fmt: skip
    missing = [m for m in modules if m.removesuffix(".py") not in layout]
    assert not missing, f"README's layout omits torch_cgx modules {missing}"
    for line in layout.splitlines():
        word = line.split()[0] if line.strip() else ""
        if word.endswith("/") and "/" in word[:-1]:  # a nested folder: it must exist
            assert (ROOT / word).is_dir(), f"README's layout names {word}, which does not exist"


DOCS = [
    ROOT / "README.md",
    ROOT / "benchmarks" / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc):
    text = doc.read_text()
    bad = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0]
        if not (doc.parent / path).exists():
            bad.append(target)
    assert not bad, f"{doc.name} links to missing files: {bad}"
