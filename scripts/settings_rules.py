"""Writes csrc/torch/settings_rules.h, the native side's copy of the settings table
(torch_cgx/settings.py): each native setting's field name, variable and default, each integer
range and its message, the call settings' variables, the rotation's blocks and min_size's floor.
BackendConfig, PlanRule, validate_fields and CallSettings read them from there.

``make settings-doc`` runs it (``python3 scripts/settings_rules.py``; ``--check`` only compares);
tests/test_settings_rules.py fails when the checked-in header is not what the table makes. It
loads the table from its file, so it runs without the built extension.
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
HEADER = ROOT / "csrc" / "torch" / "settings_rules.h"
INT64_MAX = 2**63 - 1

PROLOGUE = """\
// Generated from the settings table (torch_cgx/settings.py) by scripts/settings_rules.py
// (`make settings-doc`); do not edit: tests/test_settings_rules.py fails when it differs from
// what the table makes. Each native setting's field, variable and default, in native units,
// and each integer range with its message. Torch-free.
#pragma once

#include <cstdint>

namespace cgx::binding::rules {

template <typename T>
struct Setting {
  const char* name;  // the BackendConfig field, as native messages name it
  const char* env;   // its CGX_* variable
  T def;
};

// [lo, hi], or `also` (lo where there is none); `text` is how the messages state it.
struct Range {
  int64_t lo, hi, also;
  const char* text;
  constexpr bool ok(int64_t v) const { return (v >= lo && v <= hi) || v == also; }
};
"""


def load_table():
    """torch_cgx/settings.py as a module of its own (it imports nothing of torch_cgx at load)."""
    name = "_cgx_settings_table"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "torch_cgx" / "settings.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def _literal(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return json.dumps(value)  # the table's strings are plain ASCII


def _setting(s) -> list:
    value = s.to_native(s.default)
    kind = "bool" if isinstance(value, bool) else "int64_t" if isinstance(value, int) else None
    kind = kind or "const char*"
    head = f"inline constexpr Setting<{kind}> k{_camel(s.name)}{{"
    body = f'"{s.native}", "{s.env}", {_literal(value)}}};'
    return [f"// {s.name} ({s.scope})", head + body]


def _range(table, s) -> list:
    r = s.check
    if not isinstance(r, table.IntRange):
        return []
    lo, hi = s.to_native(r.lo), s.to_native(r.hi)
    if hi > INT64_MAX:
        return [f"// {s.name}: its range exceeds int64_t; the table's check is the only one"]
    assert len(r.also) <= 1, f"{s.name}: the native Range carries one extra value at most"
    also = s.to_native(r.also[0]) if r.also else lo
    head = f"inline constexpr Range k{_camel(s.name)}Range{{"
    body = f"{lo}, {hi}, {also}, {_literal(r.text)}}};"
    return [head + body]


def render(table=None) -> str:
    """The header ``table`` (default: torch_cgx/settings.py) makes."""
    table = table or load_table()
    lines = [
        PROLOGUE.rstrip("\n"),
        "",
        "// One declaration a line, as generated.",
        "// clang-format off",
    ]
    for s in table.GROUP_SETTINGS:
        if s.native is None or s.name == "compressor_params":  # a map natively: no default
            continue
        lines += _setting(s) + _range(table, s)
    calls = ", ".join(f"k{_camel(name)}.env" for name in table.CALL_SETTINGS)
    lo, hi = table.ROTATION_BLOCKS
    blocks_text = _literal(table.ROTATION_BLOCKS_TEXT)
    lines += [
        "",
        "// The call settings, read again at every allreduce (call_settings.h), in table order.",
        f"inline constexpr int kCallSettings = {len(table.CALL_SETTINGS)};",
        f"inline constexpr const char* kCallVars[kCallSettings] = {{{calls}}};",
        "// rotation on needs a bucket_size that is a power of two in [lo, hi].",
        f"inline constexpr int64_t kRotationMinBlock = {lo};",
        f"inline constexpr int64_t kRotationMaxBlock = {hi};",
        f"inline constexpr const char* kRotationBlocksText = {blocks_text};",
        "// A min_size below this acts as it.",
        f"inline constexpr int64_t kMinSizeFloor = {table.MIN_SIZE_FLOOR};",
        "// clang-format on",
        "",
        "}  // namespace cgx::binding::rules",
    ]
    return "\n".join(lines) + "\n"


def main(argv) -> int:
    text = render()
    if "--check" in argv:
        if HEADER.read_text() != text:
            print(f"{HEADER} is stale: run `make settings-doc`", file=sys.stderr)
            return 1
        return 0
    HEADER.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
