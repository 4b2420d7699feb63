"""The backend's rotation lever (CGX_COMPRESSION_ROTATION): max-min at 1-4 bits rotates every
full bucket before quantizing and rotates back after, for the backend-only path (CGX_* variables
and DDP without a hook). 2 real ranks."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from dist_helpers import run_ranks

B = 128


def _spiky(rank: int, n: int) -> torch.Tensor:
    """Normal values with one outlier of 50 sigma per bucket: max-min's worst case."""
    g = torch.Generator().manual_seed(10 + rank)
    x = torch.randn(n, generator=g)
    x[::B] *= 50
    return x


def _same_everywhere(t: torch.Tensor, gloo) -> None:
    raw = t.contiguous().view(-1).view(torch.uint8)
    got = [torch.empty_like(raw) for _ in range(dist.get_world_size())]
    dist.all_gather(got, raw, group=gloo)
    assert all(torch.equal(g, got[0]) for g in got)


def _rotate(t: torch.Tensor, seed: int, forward: bool) -> None:
    from torch_cgx import _C

    full = t.numel() // B * B
    _C.rotate_(t[:full], B, seed, forward)


def body_rotation(rank, world):
    import torch_cgx

    dist.init_process_group("cgx")
    gloo = dist.new_group(backend="gloo")
    backend = torch_cgx.cgx_backend()
    n = B * 40 + 37  # a short last bucket: not rotated
    x = _spiky(rank, n)
    exact = sum(_spiky(r, n).double() for r in range(world))
    assert torch_cgx.get_config().rotation == "off"  # the default
    torch_cgx.set_config(bits=4, bucket_size=B, rotation="auto")
    y = x.clone()
    dist.all_reduce(y)  # the group's first rotated call: seed 0 * 1000003 + 0 + 1
    _same_everywhere(y, gloo)
    # Bit for bit what rotating by hand around an unrotated allreduce gives.
    # (clip "auto" clips where the call rotates: by hand, it is "on").
    torch_cgx.set_config(rotation="off", clip="on")
    z = x.clone()
    _rotate(z, 1, True)
    dist.all_reduce(z)
    _rotate(z, 1, False)
    assert torch.equal(y, z)
    torch_cgx.set_config(clip="auto")
    plain = x.clone()
    dist.all_reduce(plain)
    err_rot, err_plain = (y.double() - exact).abs(), (plain.double() - exact).abs()
    assert err_rot.mean() < 0.5 * err_plain.mean(), (err_rot.mean(), err_plain.mean())
    assert torch.equal(y[-37:], plain[-37:])  # the short bucket is not rotated
    # Error feedback through the rotation: the residuals are in the gradient's domain, so what
    # was sent plus every rank's residual is what was given.
    torch_cgx.set_config(rotation="on")
    res = torch.empty(n)
    y = x.clone()
    backend.allreduce_with(y, backend.config(), False, res).wait()
    fed = res.clone()
    dist.all_reduce(fed, group=gloo)
    assert torch.allclose(exact.float() - y, fed, atol=1e-3)
    # AVG of bf16 through the fp32 rotation: identical everywhere, close to the mean.
    h = x.bfloat16()
    dist.all_reduce(h, op=dist.ReduceOp.AVG)
    _same_everywhere(h, gloo)
    assert h.dtype == torch.bfloat16
    assert (h.double() - exact / world).abs().mean() < 0.5 * err_plain.mean() / world + 0.05
    # auto: not at 8 bits, not with a bucket that is not a power of two.
    for bits, bucket in ((8, B), (4, 100)):
        torch_cgx.set_config(bits=bits, bucket_size=bucket, rotation="auto")
        a = x.clone()
        dist.all_reduce(a)
        torch_cgx.set_config(rotation="off")
        b = x.clone()
        dist.all_reduce(b)
        assert torch.equal(a, b), (bits, bucket)
    dist.destroy_process_group()


def test_backend_rotation_two_ranks():
    run_ranks(body_rotation, 2, timeout=120)


def test_rotation_setting_values():
    from torch_cgx.config import CGXConfig

    for raw, mode in (("1", "on"), ("on", "on"), ("0", "off"), ("auto", "auto")):
        assert CGXConfig.from_env({"CGX_COMPRESSION_ROTATION": raw}).rotation == mode
    assert CGXConfig().rotation == "off"
    with pytest.raises(ValueError, match="CGX_COMPRESSION_ROTATION must be auto, on or off"):
        CGXConfig.from_env({"CGX_COMPRESSION_ROTATION": "maybe"})
    with pytest.raises(ValueError, match="rotation on needs a bucket_size that is a power of two"):
        CGXConfig(rotation="on", bucket_size=500)


def test_clip_setting_values():
    from torch_cgx.config import CGXConfig

    for raw, mode in (("1", "on"), ("off", "off"), ("0", "off"), ("auto", "auto")):
        assert CGXConfig.from_env({"CGX_COMPRESSION_CLIP": raw}).clip == mode
    assert CGXConfig().clip == "auto" and CGXConfig(clip="on").to_native().clip == "on"
    with pytest.raises(ValueError, match="CGX_COMPRESSION_CLIP must be auto, on or off"):
        CGXConfig.from_env({"CGX_COMPRESSION_CLIP": "sometimes"})
