"""docs/settings.md, generated from the settings table (torch_cgx/settings.py) by
``make settings-doc``; tests/test_settings.py fails when the file and the table differ."""

from __future__ import annotations

from torch_cgx.settings import MIN_SIZE_DEFAULTS, SETTINGS

__all__ = ["markdown"]


def markdown() -> str:
    """docs/settings.md: the reference table, generated from SETTINGS."""
    lines = [
        "# Settings reference",
        "",
        "Generated from `torch_cgx/settings.py` by `make settings-doc` (a test checks that the "
        "two agree). Every setting can be given as a "
        "keyword of `torch_cgx.Options(...)` (passed as `pg_options` to `init_process_group` / "
        "`new_group`) or of `torch_cgx.set_config(group, ...)`, or as its environment variable; "
        "a keyword given to `Options` wins over the variable.",
        "",
        "Scopes: **process**: read once at `import torch_cgx`; **creation**: fixed when the "
        "group is created; **group**: per group, changed by the collective `set_config`; "
        "**call**: per group, and read again from the environment at every allreduce while "
        "`settings_per_call` is on (as CGX does). Integers are decimal; booleans 1/0, "
        "true/false, yes/no, on/off. A malformed value raises `ValueError` naming the variable "
        "or keyword.",
        "",
        "| keyword | variable | scope | default | meaning |",
        "|---|---|---|---|---|",
    ]
    for s in SETTINGS:
        default = s.default_doc or (
            str(int(s.default)) if isinstance(s.default, bool) else f"`{s.default}`"
            if s.default != "" else "(none)"
        )  # fmt: skip
        names = f"`{s.name}`" + "".join(f" (`{a}`)" for a in s.aliases)
        var = f"`{s.env}`" + (f" (`{s.env_alias}`)" if s.env_alias else "")
        lines.append(f"| {names} | {var} | {s.scope} | {default} | {s.doc} |")
    lines += ["", "## min_size per entry point", "",
              "Each entry point reduces smaller tensors exactly; where it is not told a "
              "`min_size`, it uses its own default (`settings.MIN_SIZE_DEFAULTS`):", "",
              "| entry point | default | where and why |", "|---|---|---|"]  # fmt: skip
    lines += [f"| {entry} | {value} | {why} |" for entry, (value, why) in MIN_SIZE_DEFAULTS.items()]
    return "\n".join(lines) + "\n"
