"""CPU smoke tests of the device benchmarks (benchmarks/device.py, benchmarks/device_allreduce.py):
every compressor's device codec verified and timed on CPU tensors, the fused columns with an
injected kernel, the verification catching a wrong payload or a wrong fused decode, bad
arguments, and the allreduce benchmark on 2 real ranks with data_plane="device"."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from benchmarks import device as bench
from torch_cgx import compressors as registry
from torch_cgx.device import codecs, kernels

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAST = ["--device", "cpu", "--size", "16K", "--rounds", "1", "--iters", "1", "--warmup", "1"]


class Fake(kernels.FusedMaxMin):
    """A fused 'kernel' on CPU tensors: the reference, its decode wrong past ``wrong_from``
    values (so that it passes the self-check on its small buffer)."""

    name = "fake-maxmin"

    def __init__(self, wrong_from=None):
        self.wrong_from = wrong_from

    def applies(self, device):
        return device.type == "cpu"

    def load(self):
        pass

    def encode(self, codec, x, seed, stream, shared=0):
        return codec.reference_encode(x, seed=seed, stream=stream)

    def decode_add_(self, codec, out, payload):
        codec.reference_decode_add_(out, payload)
        if self.wrong_from is not None and out.numel() > self.wrong_from:
            out[-1] += 1
        return out


@pytest.fixture
def auto_kernels(monkeypatch):
    monkeypatch.setenv("CGX_DEVICE_KERNELS", "auto")
    kernels.reset()
    yield
    kernels.reset()


def _run(tmp_path, *extra):
    path = tmp_path / "records.json"
    rc = bench.main(FAST + ["--json", str(path), *extra])
    return rc, json.loads(path.read_text())


def test_every_device_codec_verified_and_timed_on_cpu(tmp_path, capsys):
    rc, records = _run(tmp_path, "--maxmin-bits", "2,4")
    out = capsys.readouterr().out
    assert rc == 0, out
    expected = [n for n in registry.native.names() if n in codecs.names()]
    assert [r["name"] for r in records] == ["maxmin", "maxmin"] + expected[1:]
    assert [r["params"]["bits"] for r in records[:2]] == [2, 4]
    for name in registry.native.names():
        if name not in codecs.names():
            assert f"{name} (no device codec)" in out
    for r in records:
        assert r["verify"] == "ok" and r["native_bytes"] == "=", r
        assert r["numel"] == 4096 and r["device"] == "cpu" and r["fused"] is None
        assert r["fused_encode_gbps"] is None and r["fused_encode_vs_copy"] is None
        for op in ("copy", "encode", "decode_add"):
            assert r[f"{op}_gbps"] > 0
        assert r["encode_vs_copy"] == pytest.approx(r["encode_gbps"] / r["copy_gbps"])
        if r["torch_encode_gbps"] is not None:
            assert r["encode_vs_torch"] == pytest.approx(r["encode_gbps"] / r["torch_encode_gbps"])
    want = codecs.get("maxmin", bits=4).encoded_size(4096)
    assert records[1]["payload_bytes"] == want


def test_fused_columns_with_an_injected_kernel(tmp_path, auto_kernels):
    with kernels.use_implementations([Fake()]):
        rc, records = _run(tmp_path, "--compressors", "maxmin,fp16")
    assert rc == 0
    mm, fp16 = records
    assert mm["fused"] == "fake-maxmin" and mm["verify"] == "ok"
    for op in ("encode", "decode_add"):
        assert mm[f"fused_{op}_gbps"] > 0
        ratio = mm[f"fused_{op}_gbps"] / mm[f"{op}_gbps"]
        assert mm[f"fused_{op}_vs_reference"] == pytest.approx(ratio)
    assert fp16["fused"] is None


def test_a_fused_decode_wrong_past_the_self_check_fails_verification(tmp_path, auto_kernels):
    with kernels.use_implementations([Fake(wrong_from=3000)]):
        rc, records = _run(tmp_path, "--compressors", "maxmin", "--no-torch-ops")
    assert rc == 1
    assert records[0]["verify"] == "FAIL" and "fused decode_add_" in records[0]["verify_detail"]


def test_a_payload_other_than_the_native_bytes_fails(tmp_path, monkeypatch):
    real_get = codecs.get

    def corrupt_get(name, **params):
        c = real_get(name, **params)
        encode = c.encode

        def flipped(x, **kw):
            p = encode(x, **kw)
            p[-1] ^= 1
            return p

        c.encode = flipped
        return c

    monkeypatch.setattr(codecs, "get", corrupt_get)
    rc, records = _run(tmp_path, "--compressors", "fp16")
    assert rc == 1
    assert records[0]["verify"] == "FAIL" and "native codec's bytes" in records[0]["verify_detail"]


def test_the_sweep_times_with_the_host_clock_where_no_graph_can_be_captured():
    from benchmarks import triton_sweep

    calls = []
    fn = lambda: calls.append(1)  # noqa: E731
    assert bench.Timer(torch.device("cpu")).captured(fn) is None and calls == []
    s = triton_sweep.timed(fn)
    assert s > 0 and triton_sweep.HOST[id(fn)] == s and len(calls) == 2  # a warm-up, one round


def test_bad_arguments(capsys):
    assert bench.main(["--device", "meta", "--size", "4K"]) == 2
    assert "--device must be cuda or cpu" in capsys.readouterr().err
    assert bench.main(["--device", "tpu", "--size", "4K"]) == 2
    assert "benchmarks.device: --device:" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert bench.main(["--device", "cuda", "--size", "4K"]) == 2
        assert "no CUDA device" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--device", "cpu", "--compressors", "nosuch"])


def test_device_allreduce_on_two_cpu_ranks():
    cmd = [sys.executable, "-m", "benchmarks.device_allreduce", "--device", "cpu", "--ranks",
           "2", "-b", "16K", "-e", "16K", "--bits", "4", "--algorithms", "sra,ring", "-n", "2",
           "-w", "1"]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1", CGX_CODEC_THREADS="1")
    env.pop("RANK", None)
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = [line.split() for line in p.stdout.splitlines() if not line.startswith("#")]
    rows = [r for r in rows if r and r[0] == "16384"]
    assert [r[2] for r in rows] == ["gloo", "cgx:sra", "cgx:ring"], p.stdout
    for r in rows[1:]:
        assert r[3] == "4" and r[8] == "0" and r[9] == "yes", r  # in bound, same on ranks
    bad = subprocess.run(cmd[:5] + ["--ranks", "1"], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert bad.returncode == 2 and "--ranks" in bad.stderr
