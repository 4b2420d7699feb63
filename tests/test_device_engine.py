"""The device engine (torch_cgx/device) on CPU tensors over real ranks, against the native CPU
engine: every case of tests/device_engine_cases.py runs once per world size (2 and 3 ranks) in
one spawn, and the tests below read what the ranks measured."""

from __future__ import annotations

import json
import os

import pytest
import torch
from device_engine_cases import CASES, RS_CASES, run_cases
from device_engine_reads import run_host_reads
from dist_helpers import run_ranks

import torch_cgx

KIND = os.environ.get("CGX_TEST_DEVICE_CODECS", "device")  # "native": the adapter only


@pytest.fixture(scope="module", params=[2, 3], ids=["W2", "W3"])
def results(request, tmp_path_factory):
    world = request.param
    path = str(tmp_path_factory.mktemp(f"engine{world}") / "results.json")
    run_ranks(run_cases, world, path, KIND, timeout=120)
    with open(path) as f:
        return json.load(f)


@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_allreduce_equals_native(results, case):
    """Result, residual and replicas: bitwise the native engine's (the same chunks, streams,
    decode-add order and averaging point)."""
    r = results[case]
    assert r["replicas"], f"{case}: replicas differ across ranks"
    assert r["bitwise"], f"{case}: differs from the native engine by {r['max_diff']} ({r['codec']})"
    assert r["residual_bitwise"], f"{case}: residual differs by {r['residual_max_diff']}"


@pytest.mark.parametrize("case", [c[0] for c in RS_CASES])
def test_reduce_scatter_equals_native(results, case):
    r = results[case]
    assert r["bitwise"], f"{case}: differs from the native reduce-scatter by {r['max_diff']}"


@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_bytes_sent_equal_native(results, case):
    """The bytes the device engine hands the transport are the native engine's, but for the
    size exchange the native allgather-reduce does for fixed-size payloads too (8 bytes to each
    peer), which the device engine skips."""
    dev, nat = results[case]["bytes"]
    world = results["world"]
    if case in ("topk", "randomk_allgather", "maxmin8_allgather"):  # fixed-size allgather
        nat -= 8 * (world - 1)
    assert dev == nat > 0


def test_call_counters_equal_native(results):
    """No stream given: each call's streams and rotation seed from the counters, as natively."""
    assert results["counters"]["bitwise"] == [True, True, True]


def test_exact_calls_equal_native(results):
    """Below min_size, exact settings (None), integers: the native exact path's bytes."""
    assert results["exact"] == {"below_min_size": True, "bf16_exact_config": True,
                                "int64_sum": True, "reduce_scatter_mean": True}  # fmt: skip


def test_header_mismatch_raises_value_error(results):
    assert "header" in results["header_mismatch"]


def test_stats_count_calls(results):
    s = results["stats"]
    assert s["calls_compressed"] == len(CASES) + 1  # and the header mismatch
    assert s["calls_exact"] == 3
    assert s["reduce_scatter_compressed"] == len(RS_CASES)
    assert 0 < s["bytes_sent"] < s["bytes_exact"]


def _cpu_only(read: str) -> bool:
    """A codec's read on a line that runs on CPU tensors only (a shortcut guarded by
    ``device.type != "cpu" or ...``: on a GPU the line reads nothing)."""
    return 'device.type != "cpu" or' in read


@pytest.fixture(scope="module")
def syncs(tmp_path_factory):
    """What tests/device_engine_reads.py's recorders saw on rank 0 of 2, per case."""
    path = str(tmp_path_factory.mktemp("syncs") / "syncs.json")
    run_ranks(run_host_reads, 2, path, KIND, timeout=120)
    with open(path) as f:
        return json.load(f)


def test_host_reads_only_size_exchange(syncs):
    """Under a TorchFunctionMode recording item / tolist / cpu / numpy / to(cpu) / bool / int /
    float of data, and value-sized ops: the engine reads nothing for dense compressors and
    random-k, and for threshold's data-sized payloads only the size exchange (transport.py's
    tolist) and the codec's selection that sizes the payload; the codecs read otherwise only in
    their CPU-only shortcuts."""
    for name, seen in syncs.items():
        seen = [s for s in seen["reads"] if not _cpu_only(s)]
        if name.startswith("threshold"):  # the payload's size: chosen by data, exchanged
            sizes = ("tolist at transport.py", "nonzero at sparse.py")
            assert seen and all(s.startswith(sizes) for s in seen), seen
            assert any(s.startswith(sizes[0]) for s in seen)
        else:
            assert seen == [], f"{name}: host reads {seen}"


def test_no_host_to_device_copies_after_warm_up(syncs):
    """After one warm-up call, no allreduce or reduce-scatter copies a value made on the host
    to the device (torch.tensor / from_numpy / as_tensor of Python data, or such a tensor moved
    or copied): device constants come from torch_cgx/device/constants.py's cache, per-call
    values (the rotation's keys, threshold's sizes) through its non-blocking ``upload``."""
    for name, seen in syncs.items():
        assert seen["uploads"] == [], f"{name}: host-to-device copies {seen['uploads']}"


# ---- single process: argument checks ----


class _Solo:
    """A one-rank transport: the engine's checks run before any message."""

    rank, size, device = 0, 1, torch.device("cpu")

    def allreduce_exact(self, t, average):
        pass


def _engine():
    from device_engine_cases import codec_factory

    from torch_cgx.device.engine import DeviceEngine

    return DeviceEngine(_Solo(), codecs=codec_factory(KIND))


def _call(**changes):
    from torch_cgx.device.engine import DeviceCall

    return DeviceCall.from_config(torch_cgx.CGXConfig(**changes), True)


def test_from_config_exact_settings_are_none():
    assert _call() is None  # bits 32
    assert _call(compressor="auto") is None
    c = _call(bits=4, bucket_size=64, rotation="on")
    assert c.rotation and dict(c.params)["clip"] == 1.0  # clip auto follows the rotation
    assert _call(bits=4, bucket_size=100).rotation is False
    assert _call(compressor="topk", compressor_params="ratio=0.1").params == (("ratio", 0.1),)


def test_bad_input_raises_value_error():
    engine, call = _engine(), _call(bits=4, bucket_size=64)
    with pytest.raises(ValueError, match="floating-point"):
        engine.allreduce(torch.arange(100), call)  # a mean of integers
    with pytest.raises(ValueError, match="real number"):
        engine.allreduce(torch.zeros(100, dtype=torch.complex64), None)
    engine.allreduce(torch.arange(100), None)  # an exact sum of integers is fine
    with pytest.raises(ValueError, match="tensor"):
        engine.allreduce([1.0, 2.0], call)
    with pytest.raises(ValueError, match="residual"):
        engine.allreduce(torch.randn(100), call, residual=torch.empty(99))
    with pytest.raises(ValueError, match="residual"):
        engine.allreduce(torch.randn(100), call, residual=torch.empty(100, dtype=torch.float16))
    with pytest.raises(ValueError, match="stream"):
        engine.allreduce(torch.randn(100), call, stream=-2)
    with pytest.raises(ValueError, match="input has"):
        engine.reduce_scatter(torch.empty(10), torch.empty(11), call)
    with pytest.raises(ValueError, match="dtype"):
        engine.reduce_scatter(torch.empty(10), torch.empty(10, dtype=torch.float16), call)
    with pytest.raises(ValueError, match="algorithm"):
        type(call)("maxmin", (), algorithm="butterfly")


def test_non_contiguous_tensor_is_reduced_in_place():
    engine, call = _engine(), _call(bits=4, bucket_size=64)
    base = torch.randn(64, 8)
    view = base.t()  # non-contiguous
    before = view.clone()
    engine.allreduce(view, call)  # one rank: the values stay (only rotation could move them)
    assert torch.equal(view, before)


def test_recorder_sees_host_reads_of_data():
    """The recorder of test_host_reads_only_size_exchange does catch reads of data (and not of
    host constants)."""
    from device_engine_reads import host_reads

    x = torch.randn(10)
    seen = host_reads(lambda: (x.sum().item(), x.to("cpu"), bool(x[0] > 0)))
    assert len(seen) == 3 and not any(_cpu_only(s) for s in seen)
    assert host_reads(lambda: torch.tensor([1.0]).to("cpu").item()) == []
    assert host_reads(lambda: torch.empty(3).tolist()) != []  # a buffer a collective filled
    assert len(host_reads(lambda: (x[x > 0], torch.nonzero(x)))) == 2  # sizes from values


def test_recorder_sees_host_to_device_copies():
    """The recorder of test_no_host_to_device_copies_after_warm_up catches uploads of host
    values, and not fills on the device, host-only constants or torch_cgx/device/constants.py."""
    import numpy as np
    from device_engine_reads import host_uploads

    from torch_cgx.device import constants

    x = torch.randn(10)
    seen = host_uploads(lambda: (
        torch.tensor([1, 2], device=x.device), torch.as_tensor([1.0], device=x.device),
        torch.from_numpy(np.zeros(3)).to(x.device), x.new_tensor([1.0]), x[[1, 2]],
        x.copy_(torch.tensor([1.0] * 10)), torch.full((), 1, dtype=torch.int32).to(x.device),
    ))  # fmt: skip
    assert [s.split(" ")[0] for s in seen] == [
        "tensor", "as_tensor", "to", "new_tensor", "__getitem__", "copy_", "to"
    ]  # fmt: skip
    assert host_uploads(lambda: (
        torch.full((3,), 2.0, device=x.device), torch.zeros(2, device=x.device),
        torch.tensor([1, 2]).tolist(), torch.tensor([]).element_size(), x.to(torch.float64),
        constants.upload(torch.tensor([5]), x.device), constants.get(("k",), x.device, lambda: [7]),
    )) == []  # fmt: skip
