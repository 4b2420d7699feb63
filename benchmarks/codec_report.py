"""The text table of ``python -m benchmarks.codec`` (records of :func:`codec_table`)."""

from __future__ import annotations

from typing import Sequence

_COLUMNS = (
    # header, width, format of one record
    ("size MB", 7, lambda r: f"{r['size_mb']:g}"),
    ("bits", 4, lambda r: str(r["bits"])),
    ("thr", 3, lambda r: str(r["threads"])),
    ("memcpy", 6, lambda r: f"{r['memcpy_gbps']:.2f}"),
    ("encode", 6, lambda r: f"{r['encode_gbps']:.2f}"),
    ("/mcpy", 5, lambda r: f"{r['encode_vs_memcpy']:.2f}"),
    ("/torch", 6, lambda r: f"{r['encode_vs_torch']:.1f}"),
    ("dec_add", 7, lambda r: f"{r['decode_add_gbps']:.2f}"),
    ("/mcpy", 5, lambda r: f"{r['decode_add_vs_memcpy']:.2f}"),
    ("/torch", 6, lambda r: f"{r['decode_add_vs_torch']:.1f}"),
    ("t_enc", 5, lambda r: f"{r['torch_encode_gbps']:.2f}"),
    ("t_dec", 5, lambda r: f"{r['torch_decode_add_gbps']:.2f}"),
    ("ratio", 5, lambda r: f"{r['compression_ratio']:.1f}"),
    ("other", 5, lambda r: "-" if r["other_load"] is None else f"{100 * r['other_load']:.0f}%"),
)


def render_rows(columns, records: Sequence[dict]) -> list:
    """A header line, a rule and one right-aligned row a record: columns are (header, width,
    format of one record)."""
    header = "  ".join(h.rjust(w) for h, w, _ in columns)
    rows = ["  ".join(fmt(r).rjust(w) for _, w, fmt in columns) for r in records]
    return [header, "-" * len(header), *rows]


def format_table(records: Sequence[dict]) -> str:
    """A fixed-width text table of :func:`codec_table` records, with a header line."""
    if not records:
        return "(no records)"
    first = records[0]
    threads = sorted({r["threads"] for r in records})
    lines = [
        f"torch_cgx codec (CPU): isa={first['isa']}, bucket={first['bucket_size']}, "
        f"threads={','.join(map(str, threads))}, torch {first['torch_version']}, "
        f"verified={'yes' if all(r['verified'] for r in records) else 'no'}",
        "GB/s of fp32 input (4*numel / median time); /mcpy, /torch: speed relative to memcpy",
        "and to the torch-ops codec",
    ]
    lines += render_rows(_COLUMNS, records)
    lines += [
        "encode: torch_cgx.codec.encode(out=) into a preallocated payload; dec_add: decode_add_",
        "  into a preallocated fp32 tensor; t_enc, t_dec:",
        "  the torch-ops codec (GB/s); ratio: fp32 bytes / payload bytes; other: CPU time of",
        "  other processes during the row, % of all cores (a high value makes the row unreliable;",
        "  - : row too short to tell)",
    ]
    return "\n".join(lines)
