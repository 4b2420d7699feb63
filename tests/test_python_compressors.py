"""Compressors written in Python (torch_cgx.compressors.register): the checks of
torch_cgx.testing over every registered compressor, the built-in Python ones' formats and bounds,
registration errors, and a user's compressor by name through every entry point on real ranks:
the cgx backend (CPU tensors, through the device plane), the compression hook with error
feedback, FSDP2's reduce-scatter (natural, mxfp4) and DiLoCo (drive, nvfp4); replicas
bit-identical."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from dist_helpers import run_ranks

from torch_cgx import compressors, testing
from torch_cgx.compressors import CompressorBase, Param
from torch_cgx.compressors.python import Context


class ScaledSign(CompressorBase):
    """A user's compressor (scaled sign, one scale per tensor): what the tests register."""

    params = {"scale": Param(1.0, 0.0, 10.0)}
    biased = True

    def body_size(self, numel):
        return 4 + (numel + 7) // 8

    def encode(self, x, ctx):
        from torch_cgx.compressors.blocks import pack_bits

        mean = (x.abs().mean() if x.numel() else x.new_zeros(())) * self.p["scale"]
        return torch.cat([mean.reshape(1).view(torch.uint8), pack_bits((x < 0).int(), 1)])

    def decode(self, body, numel):
        from torch_cgx.compressors.blocks import unpack_bits

        negative = unpack_bits(body[4:], numel, 1)
        return body[:4].view(torch.float32) * (1 - 2 * negative).float()


@pytest.mark.parametrize("name", compressors.names())
def test_every_registered_compressor_passes_the_checks(name):
    testing.check_compressor(name, sizes=(0, 1, 7, 1000, 4099), draws=120)


def test_natural_format_and_bound():
    c = compressors.get("natural")
    x = torch.tensor([0.0, 1.0, -1.5, 3.0, 2.0**-130, float("inf"), 2.0**127 * 1.9])
    p = c.encode(x, seed=1)
    assert p.numel() == 16 + 7 + 1 and bytes(p[:4].tolist()) == b"CGXP"
    y = c.decode(p)
    assert y[0] == 0 and y[1] == 1 and y[2] in (-1.0, -2.0) and y[3] in (2.0, 4.0)
    assert y[4] in (0.0, 2.0**-126) and torch.isnan(y[5]) and y[6] == 2.0**127
    mags = y[:4].abs()
    assert torch.equal(mags, torch.exp2(torch.log2(mags.clamp(min=2.0**-149)).round()) * (mags > 0))


@pytest.mark.parametrize("seed,stream", [(0, 0), (1, 2), (2**63 + 5, 2**40 + 7)])
def test_int32_draws_are_the_format_generator(seed, stream):
    ctx = Context(seed, stream)  # keys with the high bit set included (negative as int32)
    u = ctx.uniform(torch.arange(5000))
    assert torch.equal(ctx.uniform_first(5000), u)
    assert torch.equal(ctx.uniform24_first(5000), (u * 2**24).to(torch.int32))
    with pytest.raises(ValueError, match="n < 2"):
        ctx.uniform24_first(1 << 31)


def test_drive_error_near_its_expectation():
    c = compressors.get("drive", block=256)
    x = torch.randn(256 * 40, generator=torch.Generator().manual_seed(0))
    err = float((c.decode(c.encode(x)) - x).square().sum() / x.square().sum())
    assert abs(err - (torch.pi / 2 - 1)) < 0.05  # DRIVE's vNMSE for Gaussian-like blocks


def test_register_errors_and_a_users_compressor():
    with pytest.raises(ValueError, match="registered already"):
        compressors.register("maxmin", ScaledSign)
    with pytest.raises(ValueError, match="CompressorBase subclass"):
        compressors.register("x1", object)
    with pytest.raises(ValueError, match="identifier"):
        compressors.register("a b", ScaledSign)
    compressors.register("scaledsign", ScaledSign, replace=True)
    try:
        assert "scaledsign" in compressors.names() and compressors.is_python("scaledsign")
        with pytest.raises(ValueError, match=r"scale must be in \[0.0, 10.0\]"):
            compressors.get("scaledsign", scale=11)
        with pytest.raises(ValueError, match="no parameter"):
            compressors.get("scaledsign", bits=3)
        testing.check_compressor(compressors.get("scaledsign", scale=2))
        other = compressors.get("natural").encode(torch.ones(100))
        with pytest.raises(ValueError, match="header"):
            compressors.get("scaledsign").decode(torch.cat([other[:16], other[16:29]]))
    finally:
        compressors.unregister("scaledsign")


def test_hivemind_named_wrapper_carries_a_python_compressor():
    from torch_cgx.compression import CGXCompression
    from torch_cgx.compression.base import extract

    x = torch.randn(40, 50, generator=torch.Generator().manual_seed(3))
    c = CGXCompression("drive", block=256)
    payload = c.compress(x)
    assert payload.method == "cgx/drive" and payload.data.numel() == c.codec_for(2000).encoded_size(
        2000
    )
    y = extract(payload)
    assert y.shape == x.shape and float((y - x).norm()) <= 255**0.5 * float(x.norm())


def test_compiled_encode_equals_eager():
    compressors.register("natural_compiled", type(compressors.get("natural").impl), compile=True)
    try:
        x = torch.randn(3000, generator=torch.Generator().manual_seed(2))
        for stream in (0, 1, 2):
            a = compressors.get("natural").encode(x, seed=4, stream=stream)
            b = compressors.get("natural_compiled").encode(x, seed=4, stream=stream)
            assert torch.equal(a[16:], b[16:])  # the header names the compressor
    finally:
        compressors.unregister("natural_compiled")


def _replicas_equal(t):
    copies = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(copies, t.contiguous())
    return all(torch.equal(c, copies[0]) for c in copies)


def _backend(rank, world):
    import torch_cgx

    for name in ("natural", "drive", "scaledsign", "mxfp8"):
        torch_cgx.set_config(compressor=name, compressor_params="")
        x = torch.randn(5000, generator=torch.Generator().manual_seed(rank)) * (rank + 1)
        want = x.clone()
        dist.all_reduce(want, group=_backend.gloo)
        got = x.clone()
        dist.all_reduce(got)
        assert _replicas_equal(got), name
        assert float((got - want).norm()) <= 2 * world * float(want.norm()) + 1e-3, name
        assert float((got - want).norm()) > 0, name  # compressed, not exact
    torch_cgx.set_config(compressor="maxmin")


def _hook(rank, world):
    from torch_cgx import CompressionState, compression_hook

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64, bias=False), torch.nn.Linear(64, 8))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    state = CompressionState(None, "scaledsign", {}, error_feedback=True, layer_min_size=1000,
                             module=model)  # fmt: skip
    ddp.register_comm_hook(state, compression_hook)
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(rank))
    for _ in range(3):
        ddp.zero_grad()
        ddp(x).sum().backward()
        assert all(_replicas_equal(p.grad) for p in ddp.parameters())


def _fsdp(rank, world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from torch_cgx import fsdp

    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.GELU(), torch.nn.Linear(256, 8))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    comm = fsdp.compress(model, _fsdp.compressor, min_size=1024)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(2):
        x = torch.randn(16, 32, generator=torch.Generator().manual_seed(10 * step + rank))
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
    assert comm.calls > 0
    for v in model.state_dict().values():
        assert _replicas_equal(v.full_tensor())


def _diloco(rank, world, compressor, params):
    from torch_cgx.diloco import DiLoCo

    torch.manual_seed(0)
    model = torch.nn.Linear(64, 32)
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    d = DiLoCo(model, inner, sync_every=2, group=_backend.gloo, compressor=compressor,
               compressor_params=params)  # fmt: skip
    assert d.error_feedback  # biased: drive, nvfp4 with nearest rounding
    with d:
        for step in range(4):
            x = torch.randn(4, 64, generator=torch.Generator().manual_seed(10 * step + rank))
            inner.zero_grad()
            model(x).square().mean().backward()
            inner.step()
            if step % 2:
                for p in model.parameters():
                    assert _replicas_equal(p.detach())


def body(rank, world):
    compressors.register("scaledsign", ScaledSign, replace=True)  # every rank, before the group
    dist.init_process_group("cgx")
    _backend.gloo = dist.new_group(backend="gloo")
    _backend(rank, world)
    _hook(rank, world)
    for name in ("natural", "mxfp4"):
        _fsdp.compressor = name
        _fsdp(rank, world)
    _diloco(rank, world, "drive", {"block": 512})
    _diloco(rank, world, "nvfp4", {})
    dist.destroy_process_group()


def test_python_compressors_through_every_entry_point():
    run_ranks(body, 2, timeout=120)


def test_a_group_without_a_plane_names_the_problem():
    run_ranks(_no_plane, 2, env={"CGX_DATA_PLANE": "host"}, timeout=60)


def _no_plane(rank, world):
    import torch_cgx

    dist.init_process_group("cgx")
    torch_cgx.set_config(compressor="natural")
    with pytest.raises(ValueError, match="written in Python"):
        dist.all_reduce(torch.ones(5000))
    dist.destroy_process_group()
