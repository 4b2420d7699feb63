"""``python -m benchmarks.codec`` on tiny sizes (a few seconds): verified records whose every
derived number (GB/s, ratios, compression ratio) equals its parts, as recorded and as printed."""

from __future__ import annotations

import json
import math

import pytest
import torch

from benchmarks import __main__ as bench_main
from benchmarks import codec as bench_codec
from benchmarks import torch_ops_codec
from torch_cgx import codec

NUMBER_KEYS = [f"{op}_{kind}" for op in bench_codec.OPS for kind in ("s", "gbps")] + [
    "encode_vs_memcpy",
    "encode_vs_torch",
    "decode_add_vs_memcpy",
    "decode_add_vs_torch",
    "compression_ratio",
]


def test_main_quick_writes_verified_records(tmp_path, capsys):
    path = tmp_path / "codec.json"
    args = ["--quick", "--sizes", "0.03125", "--bits", "2,4", "--threads", "1,all"]
    assert bench_codec.main([*args, "--iters", "2", "--retries", "0", "--json", str(path)]) == 0
    records = json.loads(path.read_text())
    threads = sorted({1, codec.num_threads()})
    assert len(records) == 2 * len(threads)
    assert {(r["bits"], r["threads"]) for r in records} == {(b, t) for b in (2, 4) for t in threads}
    for r in records:
        assert r["verified"] is True
        assert r["numel"] == 0.03125 * (1 << 20) // 4
        assert r["payload_bytes"] == codec.encoded_size(r["numel"], r["bits"], 512)
        for key in NUMBER_KEYS:
            assert math.isfinite(r[key]) and r[key] > 0, key
        check_derived(r)
    out = capsys.readouterr().out
    assert "isa=" in out and "torch " in out and "verified=yes" in out
    table = bench_codec.format_table(records)
    assert table in out
    lines = table.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("---")) + 1
    rows = [line.split() for line in lines[start : start + len(records)]]
    assert all(len(c) == 14 for c in rows) and lines[start + len(records)].startswith("encode:")
    for cells, r in zip(rows, records):
        check_printed(cells, r)


def check_derived(r: dict) -> None:
    """Every derived number of a record equals its parts: GB/s = 4 numel / seconds, the ratios
    the quotients of those GB/s, the compression ratio fp32 bytes over payload bytes."""
    for op in bench_codec.OPS:
        assert r[f"{op}_gbps"] == pytest.approx(4 * r["numel"] / r[f"{op}_s"] / 1e9, rel=1e-12)
    for op in ("encode", "decode_add"):
        g = r[f"{op}_gbps"]
        assert r[f"{op}_vs_memcpy"] == pytest.approx(g / r["memcpy_gbps"], rel=1e-12), op
        assert r[f"{op}_vs_torch"] == pytest.approx(g / r[f"torch_{op}_gbps"], rel=1e-12), op
    assert r["compression_ratio"] == pytest.approx(4 * r["numel"] / r["payload_bytes"], rel=1e-12)


def _quotient_ok(printed: str, num: str, den: str, digits: int) -> bool:
    """Whether a printed ratio is the quotient of the printed columns, up to their rounding
    (each column to 2 decimals, the ratio to ``digits``)."""
    n, d, q = float(num), float(den), float(printed)
    if d < 0.01:  # 0.00 printed: the quotient is unknown
        return True
    slack = 0.5 * 10**-digits + (n + 0.005) / (d - 0.005) - n / d + 0.005 / d
    return abs(q - n / d) <= slack * 1.0001


def check_printed(cells: list, r: dict) -> None:
    mem, enc, dec, t_enc, t_dec = cells[3], cells[4], cells[7], cells[10], cells[11]
    assert float(cells[0]) == r["size_mb"] and int(cells[1]) == r["bits"]
    assert _quotient_ok(cells[5], enc, mem, 2) and _quotient_ok(cells[6], enc, t_enc, 1), cells
    assert _quotient_ok(cells[8], dec, mem, 2) and _quotient_ok(cells[9], dec, t_dec, 1), cells
    assert float(cells[12]) == round(4 * r["numel"] / r["payload_bytes"], 1), cells


def test_codec_table_restores_threads():
    before = (torch.get_num_threads(), codec.num_threads())
    records = bench_codec.codec_table([1 / 64], [1, 8], [1], iters=1, warmup=0, retries=0)
    assert [r["bits"] for r in records] == [1, 8]
    assert (torch.get_num_threads(), codec.num_threads()) == before


def test_verify_catches_a_corrupt_payload():
    x = torch.randn(3000)
    payload = codec.encode(x, 4, 512)
    bench_codec.verify_codec(x, payload, 4, 512)
    payload[-50] ^= 0xFF
    with pytest.raises(bench_codec.VerifyError):
        bench_codec.verify_codec(x, payload, 4, 512)


@pytest.mark.parametrize("bits", torch_ops_codec.SUPPORTED_BITS)
@pytest.mark.parametrize("numel,bucket", [(1, 512), (1000, 512), (4096, 512), (999, 7)])
def test_torch_ops_codec_round_trip(bits, numel, bucket):
    x = torch.randn(numel) * 4
    payload = torch_ops_codec.encode(x, bits, bucket)
    assert payload.numel() == torch_ops_codec.encoded_size(numel, bits, bucket)
    assert torch_ops_codec.max_abs_error_ok(x, bits, bucket)
    base = torch.ones(numel)
    torch_ops_codec.decode_add_(base, payload, bits, bucket)
    decoded = torch_ops_codec.decode_add_(torch.zeros(numel), payload, bits, bucket)
    torch.testing.assert_close(base, decoded + 1)


def test_dispatcher(capsys):
    assert bench_main.main(["no-such-entry-point"]) == 2
    assert bench_main.main([]) == 2
    assert bench_main.main(["--help"]) == 0
    listed = capsys.readouterr().out
    assert all(f"  {name} " in listed for name in bench_main.ENTRY_POINTS)
    # The dispatcher hands the rest of the line to the module's own main() (its parser here).
    with pytest.raises(SystemExit) as e:
        bench_main.main(["codec", "--bits", "3"])
    assert e.value.code == 2 and "bits must be in" in capsys.readouterr().err
