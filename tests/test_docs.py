"""The README's layout matches the tree, and every relative link in the README and docs/ points at
a file that exists (the reference tables moved into docs/; links must follow); every count of
compressors the docs state is the registry's, and every test they cite (a file under tests/, or
``tests/x.py::name``) exists."""

from __future__ import annotations

import ast
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
    *sorted((ROOT / "benchmarks" / "results").glob("*.md")),
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


# --- counts of compressors: the registry's size, however a doc words it ------------------------

_WORDS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen twenty".split())}  # fmt: skip
_NUM = r"(\d+|" + "|".join(_WORDS) + r")"
# The phrasings the docs use, and the registry size each implies:
#   "16 compressors", "16 registered compressors"   -> 16
#   "15 other compressors", "max-min and 15 others"  -> 16 (max-min is the one more)
# A count followed by "then" ("the 15 compressors registered then") records an earlier registry
# and is not checked; a subset is worded so that it does not match ("7 of the compressors",
# "10 dense compressors").
_COUNT = re.compile(
    rf"\bmax-?min\s+(?:and|plus)\s+{_NUM}\s+others\b"
    rf"|\b{_NUM}\s+(other\s+|registered\s+)?compressors\b(?!\s+(?:registered\s+)?then\b)",
    re.IGNORECASE,
)


def compressor_counts(text: str) -> list:
    """(phrase, the registry size it states) for every count of compressors in ``text``."""
    out = []
    for m in _COUNT.finditer(text):
        number = m.group(1) or m.group(2)
        n = int(number) if number.isdigit() else _WORDS[number.lower()]
        other = m.group(1) is not None or (m.group(3) or "").strip().lower() == "other"
        out.append((" ".join(m.group(0).split()), n + other))
    return out


def test_compressor_counts_finds_each_phrasing():
    text = (
        "16 compressors; sixteen registered compressors; 15 other compressors; max-min\nand "
        "15 others; the 15 compressors registered then; all 10 dense compressors"
    )
    assert [n for _, n in compressor_counts(text)] == [16, 16, 16, 16]


@pytest.mark.parametrize("doc", [d for d in DOCS if d.parent.name != "results"],
                         ids=lambda p: str(p.relative_to(ROOT)))  # fmt: skip
def test_compressor_counts_match_the_registry(doc):  # dated records count what was then
    from torch_cgx import compressors

    size = len(compressors.names())
    wrong = [phrase for phrase, n in compressor_counts(doc.read_text()) if n != size]
    assert not wrong, f"{doc.name} counts compressors wrongly (the registry has {size}): {wrong}"


def test_readme_states_the_count():
    assert compressor_counts((ROOT / "README.md").read_text()), (
        "the README no longer states how many compressors there are in a phrasing "
        "compressor_counts() knows: keep the check alive"
    )


# --- tests cited by the docs exist --------------------------------------------------------------

_TEST_REF = re.compile(r"(?<![\w/.-])(tests/[\w*./-]*[\w*])(?:::([\w:]+))?")


def _defined_names(path: pathlib.Path) -> set:
    """Module-level functions, classes and assigned names, and "Class::method" for methods."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            names |= {f"{node.name}::{n.name}" for n in node.body
                      if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}  # fmt: skip
        if isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_cited_tests_exist(doc):
    bad = []
    for m in _TEST_REF.finditer(doc.read_text()):
        path, name = m.group(1), m.group(2)
        files = sorted(ROOT.glob(path)) if "*" in path else [ROOT / path]
        if not files or not all(f.exists() for f in files):
            bad.append(m.group(0))
        elif name and not (files[0].suffix == ".py" and name in _defined_names(files[0])):
            bad.append(m.group(0))
    assert not bad, f"{doc.name} cites tests that do not exist: {bad}"
