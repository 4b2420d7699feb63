"""The text table of ``python -m benchmarks.codec --compressors ...`` (records of
:func:`benchmarks.compressors.compressor_table`)."""

from __future__ import annotations

from typing import Sequence

from benchmarks.codec_report import render_rows
from benchmarks.timing import MB


def _opt(fmt: str, key: str):
    return lambda r: "-" if r[key] is None else format(r[key], fmt)


_COLUMNS = (
    # header, width, format of one record
    ("compressor", 10, lambda r: r["name"]),
    ("thr", 3, lambda r: str(r["threads"])),
    ("ratio", 6, lambda r: f"{r['ratio']:.1f}"),
    ("memcpy", 6, lambda r: f"{r['memcpy_gbps']:.2f}"),
    ("pcpy", 6, lambda r: f"{r['pcpy_gbps']:.1f}"),
    ("encode", 6, lambda r: f"{r['encode_gbps']:.2f}"),
    ("/mcpy", 5, lambda r: f"{r['encode_vs_memcpy']:.2f}"),
    ("/torch", 6, lambda r: f"{r['encode_vs_torch']:.1f}"),
    ("dec_add", 7, lambda r: f"{r['decode_add_gbps']:.2f}"),
    ("/torch", 6, lambda r: f"{r['decode_add_vs_torch']:.1f}"),
    ("t_enc", 5, lambda r: f"{r['torch_encode_gbps']:.2f}"),
    ("t_dec", 5, lambda r: f"{r['torch_decode_add_gbps']:.2f}"),
    ("max_err", 8, _opt(".3g", "max_err")),
    ("verify", 6, lambda r: r["verify"]),
    ("other", 5, lambda r: "-" if r["other_load"] is None else f"{100 * r['other_load']:.0f}%"),
)


def format_table(records: Sequence[dict]) -> str:
    """A fixed-width text table of :func:`compressor_table` records, with a header."""
    if not records:
        return "(no records)"
    first = records[0]
    lines = [
        f"torch_cgx compressors (CPU): {first['numel']} fp32 values "
        f"({first['input_bytes'] / MB:g} MiB), isa={first['isa']}, "
        f"threads={','.join(str(t) for t in sorted({r['threads'] for r in records}))}, "
        f"torch {first['torch_version']}, default parameters",
        "GB/s of fp32 input (4*numel / median time); /mcpy, /torch: encode (or dec_add) speed",
        "relative to memcpy of the input and to the torch-ops version",
    ]
    lines += render_rows(_COLUMNS, records)
    encode = "allocates its payload" if first["encode_includes_alloc"] else "reuses an out= buffer"
    lines += [
        "ratio: input bytes / payload bytes; pcpy: copy_ of the payload's bytes (as GB/s of",
        f"  input); encode {encode}; t_enc, t_dec:",
        "  the torch-ops versions (benchmarks/torch_ops_compressors.py); max_err: max",
        "  |decode - x| of ours; verify: within the compressor's worst case (ok), FAIL (ours),",
        "  t-FAIL (torch-ops); other: CPU time of other processes, % of all cores",
    ]
    return "\n".join(lines)
