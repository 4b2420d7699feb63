"""torch_cgx.diloco in one process: the schedule against docs/diloco.md's formula, bad arguments,
and the seam that gives CUDA buffers the device plane's codec (checked on CPU tensors)."""

from __future__ import annotations

import pytest
import torch
from diloco_testing import documented, make_model

from torch_cgx.diloco import DiLoCo, Schedule


def test_schedule_object_follows_the_documented_formula():
    for h, k, d in ((6, 3, 1), (7, 3, 1), (5, 1, 4), (4, 4, 0), (500, 8, 20)):
        s = Schedule(h, k, d)
        starts, applies = documented(h, k, d)
        for t in range(1, 4 * h):
            assert s.starts_at(t) == [f for f in range(k) if t in starts[f]]
            assert s.applies_at(t) == [f for f in range(k) if t in applies[f]]
    # The case the streaming test runs, spelled out.
    assert documented(6, 3, 1)[1] == {0: [2, 8, 14, 20], 1: [4, 10, 16, 22], 2: [6, 12, 18]}


# --- bad arguments -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"sync_every": 0}, "sync_every"),
        ({"semi_async": True, "fragment_sync_delay": 1}, "fragment_sync_delay must be 0"),
        ({"semi_async": 1}, "semi_async"),
        ({"sync_every": 2.5}, "sync_every"),
        ({"sync_every": 1}, "sync_every"),  # fewer steps than the 2 fragments
        ({"fragment_sync_delay": 2}, "fragment_sync_delay"),  # >= 4 // 2
        ({"fragment_sync_delay": -1}, "fragment_sync_delay"),
        ({"fragment_update_alpha": 1.5}, "fragment_update_alpha"),
        ({"fragment_update_alpha": True}, "fragment_update_alpha"),
        ({"compressor": "nope"}, "compressor"),
        ({"compressor": "maxmin", "compressor_params": {"bits": 12}}, "compressor_params"),
        ({"compressor": "maxmin", "compressor_params": [4]}, "compressor_params"),
        ({"compressor": None, "error_feedback": True}, "error_feedback"),
        ({"error_feedback": "yes"}, "error_feedback"),
        ({"group": "world"}, "group"),
        ({"outer_optimizer": 3}, "outer_optimizer"),
    ],
)
def test_bad_arguments_raise(kwargs, match):
    model = make_model(seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    kwargs = {"sync_every": 4, **kwargs}
    with pytest.raises(ValueError, match=match):
        DiLoCo(list(model), opt, **kwargs)


def test_bad_fragments_and_optimizers():
    model = make_model(seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="model_fragments"):
        DiLoCo([], opt, sync_every=4)
    with pytest.raises(ValueError, match="model_fragments"):
        DiLoCo([model, model[0]], opt, sync_every=4)  # a parameter in two fragments
    with pytest.raises(ValueError, match="inner_optimizer"):
        DiLoCo(model, None, sync_every=4)
    with pytest.raises(ValueError, match="every fragment's"):  # one optimizer, a part of two
        DiLoCo(list(model), opt, torch.optim.SGD(model[0].parameters(), lr=1), sync_every=4)
    with pytest.raises(ValueError, match="its fragment's"):  # not the fragment's params
        DiLoCo(model, opt, torch.optim.SGD(model[0].parameters(), lr=1), sync_every=4)
    with pytest.raises(ValueError, match=r"outer_optimizer\[1\]"):
        outer = [torch.optim.SGD(m.parameters(), lr=1) for m in (model[0], model[0])]
        DiLoCo([model[0], model[1]], opt, outer, sync_every=4)
    with pytest.raises(ValueError, match="init_process_group"):
        DiLoCo(model, opt, sync_every=4)  # valid, but no process group here


def test_cuda_buffers_take_the_device_codec_with_the_host_bytes():
    """The seam for CUDA buffers: the device plane's codec where one exists, giving the host
    compressor's bytes and sums (checked here on CPU tensors; no GPU needed)."""
    from torch_cgx.diloco.reduce import Spec, _Codec

    x = torch.randn(3000, generator=torch.Generator().manual_seed(0))
    for name, params in (("maxmin", {"bits": 4}), ("topk", {"ratio": 0.05}), ("tbq", {})):
        spec = Spec(name, params)
        device, host = _Codec(spec, torch.device("cuda")), _Codec(spec, torch.device("cpu"))
        assert not device.host and host.host
        payload = device.encode(x, stream=3, shared=1)
        assert torch.equal(payload, host.encode(x, stream=3, shared=1))
        a, b = torch.ones(3000), torch.ones(3000)
        device.decode_add_(a, payload)
        host.decode_add_(b, payload)
        assert torch.equal(a, b)
