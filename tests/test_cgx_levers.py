"""The CGX hook's accuracy levers (docs/accuracy.md): layer-aligned staging, error feedback,
rotation, adaptive bits per layer; unit tests of the helpers, then real ranks through DDP."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from dist_helpers import run_ranks

from torch_cgx import codec
from torch_cgx.bounds import allreduce_error_bound
from torch_cgx.hooks import levers

# ---- helpers, no process group -------------------------------------------------------------


def _spans(sizes):
    spans, o = [], 0
    for n in sizes:
        spans.append((o, n, None))
        o += n
    return spans


def test_stage_starts_every_layer_on_a_bucket_and_pads_with_its_last_value():
    sizes, bucket = [3201, 50, 1024, 7], 256
    buf = torch.randn(sum(sizes))
    st = levers.stage(buf, _spans(sizes), bucket, True, torch.float32, [None] * 4, [])
    assert st.starts == [0, 3328, 3584, 4608] and st.sizes == [3328, 256, 1024, 256]
    for (o, n, _), start, size in zip(st.spans, st.starts, st.sizes):
        assert start % bucket == 0 and size % bucket == 0
        assert torch.equal(st.tensor[start : start + n], buf[o : o + n])
        assert bool((st.tensor[start + n : start + size] == buf[o + n - 1]).all())
    # Every codec bucket holds one layer's values only: its range is within that layer's.
    for (o, n, _), start, size in zip(st.spans, st.starts, st.sizes):
        layer = buf[o : o + n]
        rows = st.tensor[start : start + size].view(-1, bucket)
        assert rows.min() >= layer.min() and rows.max() <= layer.max()
    out = torch.zeros_like(buf)
    assert levers.unstage(st, out, bucket) == []
    assert torch.equal(out, buf)
    # Without split_layers: the concatenation, as CGX's hook sends it.
    st = levers.stage(buf, _spans(sizes), bucket, False, torch.float32, [None] * 4, [])
    assert torch.equal(st.tensor, buf)


def test_stage_adds_residuals_and_rotation_round_trips():
    sizes, bucket = [1000, 300], 128
    buf = torch.randn(1300)
    res = [torch.randn(1000), None]
    st = levers.stage(buf, _spans(sizes), bucket, True, torch.float32, res, [11, 12])
    # Rotated: the first layer's span is no longer the plain values but keeps their norm.
    sent = buf[:1000] + res[0]
    want = torch.cat([sent, sent[-1:].expand(24)])  # padded with the last value sent
    got = st.tensor[:1024]
    assert not torch.allclose(got, want)
    assert abs(got.norm() - want.norm()) <= 1e-5 * want.norm()
    st.residual = st.tensor.clone()  # as if everything had been lost: rotated back too
    out = torch.zeros(1300)
    layers = levers.unstage(st, out, bucket)
    assert torch.allclose(out[:1000], buf[:1000] + res[0], atol=1e-5)
    assert torch.allclose(out[1000:], buf[1000:], atol=1e-5)
    assert torch.allclose(layers[0], buf[:1000] + res[0], atol=1e-5)


def test_rotate_rejects_bad_input():
    from torch_cgx import _C

    with pytest.raises(ValueError, match="multiple of the block"):
        _C.rotate_(torch.zeros(100), 64, 1, True)
    with pytest.raises(ValueError, match="power of two"):
        _C.rotate_(torch.zeros(96), 96, 1, True)
    with pytest.raises(ValueError, match="float32"):
        _C.rotate_(torch.zeros(64, dtype=torch.float16), 64, 1, True)
    with pytest.raises(ValueError, match="contiguous"):
        _C.rotate_(torch.zeros(128)[::2], 64, 1, True)


def test_error_model_matches_the_codec():
    """E(b) = B sum r_k^2 / (12 (2^b - 1)^2): round-to-nearest's squared error on values spread
    evenly over each bucket's range, measured through the codec (within 5 %)."""
    torch.manual_seed(0)
    bucket = 512
    n = bucket * 400 + 100  # and a short last bucket, counted at its own length
    x = torch.rand(n) * torch.linspace(0.1, 5, n)  # ranges differ
    energy = levers.range_energy(x, 0, n, bucket)
    for bits in (2, 3, 4, 6):
        y = codec.decode(codec.encode(x, bits, bucket))
        measured = float(((y - x).double() ** 2).sum())
        assert measured == pytest.approx(levers.error_at(energy, bits), rel=0.05), bits


def test_clipped_error_model_matches_the_codec():
    """With the clipped range, E(b) = GAUSSIAN_MSE[b] sum_k n_k sd_k^2 on Gaussian buckets of
    different scales, measured through the codec (within 5 %)."""
    torch.manual_seed(1)
    bucket = 512
    x = (torch.randn(400, bucket) * torch.linspace(0.1, 5, 400)[:, None]).reshape(-1)
    energy = levers.spread_energy(x, 0, x.numel(), bucket)
    for bits in (1, 2, 3, 4):
        y = codec.decode(codec.encode(x, bits, bucket, clip=True))
        measured = float(((y - x).double() ** 2).sum())
        assert measured == pytest.approx(levers.error_at(energy, bits, True), rel=0.05), bits
    # Max's curve is flatter than max-min's: a layer with 2 bits can be worth more than one at 3.
    assert levers.choose_bits([4.0, 1.0], [1000, 1000], 3.0, clipped=True) == [4, 2]
    assert levers.choose_bits([1.5, 1.0], [1000, 1000], 2.5, clipped=True) == [3, 2]


def test_choose_bits_puts_bits_where_the_math_says():
    # Two equal layers, one with 4x the range (16x the energy): at an average of 3 bits,
    # (4, 2) costs 16/225 + 1/9 = 0.18 E against (3, 3) at 17/49 = 0.35 E and (5, 1) at 1.02 E.
    assert levers.choose_bits([16.0, 1.0], [1000, 1000], 3.0) == [4, 2]
    assert levers.choose_bits([1.0, 1.0, 1.0], [10, 10, 10], 4.0) == [4, 4, 4]
    bits = levers.choose_bits([5.0, 1e-3, 2.0, 0.0], [4000, 100, 2500, 777], 3.0)
    assert sum(b * n for b, n in zip(bits, [4000, 100, 2500, 777])) <= 3.0 * 7377
    assert bits[3] == 1 and bits[0] >= bits[2]  # no error to remove, nothing spent on it
    assert levers.choose_bits([1.0], [10], 8.0) == [8]
    with pytest.raises(ValueError, match="budget"):
        levers.choose_bits([1.0], [10], 0.5)


def test_state_validation_and_old_checkpoints():
    from torch_cgx import CGXState

    model = torch.nn.Linear(4, 4)
    with pytest.raises(ValueError, match="power of two"):
        CGXState(compression_params={"bucket_size": 1000}, rotation=True)
    with pytest.raises(ValueError, match="needs module"):
        CGXState(adaptive_bits=3)
    with pytest.raises(ValueError, match=r"in \[1, 8\]"):
        CGXState(adaptive_bits=9, module=model)
    with pytest.raises(ValueError, match="split_layers"):
        CGXState(adaptive_bits=3, module=model, split_layers=False)
    with pytest.raises(ValueError, match="error_feedback"):
        CGXState(error_feedback="yes")
    with pytest.raises(ValueError, match="stochastic"):
        CGXState(compression_params={"stochastic": True}, stochastic=False)
    assert CGXState(compression_params={"stochastic": True}).levers["stochastic"] is True
    assert CGXState(stochastic=True).levers["stochastic"] is True
    assert CGXState().resolved(4, True)["stochastic"]  # unless given: the group's rounding
    assert not CGXState(stochastic=False).resolved(4, True)["stochastic"]
    with pytest.raises(ValueError, match="adapt_every"):
        CGXState(adapt_every=0)
    s = CGXState(compression_params={"bits": 2})
    assert s.resolved(2)["rotation"] and s.resolved(2)["split_layers"]
    assert not CGXState(legacy=True).resolved(2)["error_feedback"]
    assert CGXState().resolved(1)["mean_levels"] and not CGXState().resolved(2)["mean_levels"]
    assert CGXState(legacy=True, error_feedback=True).resolved(2)["error_feedback"]
    # clip follows the rotation unless given (it suits rotated, near-Gaussian buckets only)
    assert CGXState().resolved(2)["clip"] and not CGXState().resolved(8)["clip"]
    assert not CGXState(rotation=False).resolved(2)["clip"]
    assert CGXState(rotation=False, clip=True).resolved(2)["clip"]
    assert (
        not CGXState(clip=False).resolved(2)["clip"]
        and not CGXState(legacy=True).resolved(2)["clip"]
    )
    with pytest.raises(ValueError, match="clip must be a bool"):
        CGXState(clip=1)
    s.residuals[id(model.weight)] = torch.zeros(16)
    with pytest.raises(ValueError, match="module=model"):
        s.__getstate__()
    # A state saved before the levers existed is CGX's hook: it keeps reducing as it did.
    old = CGXState.__new__(CGXState)
    old.__setstate__({"layer_min_size": 9, "compression_params": {"bits": 4}})
    assert old.legacy and not old.resolved(4)["split_layers"]


# ---- real ranks ------------------------------------------------------------------------------


class Probe(torch.nn.Module):
    """loss = sum_i <w_i, c_i>: the gradient of w_i is exactly c_i, chosen per rank."""

    def __init__(self, shapes) -> None:
        super().__init__()
        self.w = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(s)) for s in shapes])

    def forward(self, coeffs):
        return sum((w * c).sum() for w, c in zip(self.w, coeffs))


SHAPES = [(33, 97), (97, 40), (64,), (16, 16)]  # 3201 and 3880 compressed; 64, 256 exact


def coeffs_of(rank: int, step: int):
    g = torch.Generator().manual_seed(1000 * step + rank)
    scales = [1.0, 50.0, 1.0, 1.0]  # layers of different scales in one bucket
    return [torch.randn(s, generator=g) * k for s, k in zip(SHAPES, scales)]


def gather(t: torch.Tensor, group) -> list:
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t.contiguous(), group=group)
    return out


def body_residual_algebra(rank, world, kwargs):
    """Over the ranks, what each sent (gradient + old residual) equals W times the result plus
    the new residuals, to fp32 rounding, every step: with and without rotation and layers."""
    from torch_cgx import CGXState, cgx_hook

    dist.init_process_group("cgx")
    gloo = dist.new_group(backend="gloo")
    model = Probe(SHAPES)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    state = CGXState(None, 1024, {"bucket_size": 128, **kwargs.pop("params")}, module=model,
                     error_feedback=True, **kwargs)  # fmt: skip
    ddp.register_comm_hook(state, cgx_hook)
    names = [n for n, _ in model.named_parameters()]
    for step in range(3):
        old = {k: v.clone() for k, v in state.residuals.items()}
        coeffs = coeffs_of(rank, step)
        ddp.zero_grad()
        ddp(coeffs).backward()
        for i in (0, 1):  # the compressed layers
            sent = coeffs[i].reshape(-1) + old.get(names[i], torch.zeros(coeffs[i].numel()))
            new = state.residuals[names[i]]
            got = model.w[i].grad.reshape(-1)
            assert torch.equal(torch.stack(gather(got, gloo)).amin(0), got), "replicas differ"
            lhs = torch.stack(gather(sent, gloo)).double().sum(0)
            rhs = world * got.double() + torch.stack(gather(new, gloo)).double().sum(0)
            tol = 1e-5 * float(lhs.abs().max()) + 1e-6
            assert float((lhs - rhs).abs().max()) <= tol, (step, i, kwargs)
            assert not torch.equal(got.double() * world, lhs), "nothing was compressed"
        for i in (2, 3):  # exact layers: the average
            want = torch.stack(gather(coeffs[i], gloo)).double().mean(0)
            assert torch.allclose(model.w[i].grad.double(), want, atol=1e-6)
    dist.destroy_process_group()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"params": {"bits": 4}},
        {"params": {"bits": 2}, "rotation": True},
        {"params": {"bits": 1}, "rotation": True, "split_layers": False},
        {"params": {"bits": 1}, "mean_levels": True},
        {"params": {"bits": 3, "stochastic": True}, "legacy": True},
    ],
    ids=[
        "4bit-layers",
        "2bit-rotation",
        "1bit-rotation-straddling",
        "1bit-means",
        "3bit-stochastic-legacy",
    ],  # fmt: skip
)
def test_error_feedback_algebra_on_real_ranks(kwargs):
    run_ranks(body_residual_algebra, 2, kwargs)


def body_layers_bound(rank, world):
    """One step without memory: each layer's error within the bound of that layer alone (padded
    to whole buckets), which the small-scale layer would exceed if a bucket mixed it with the
    layer 50x larger (checked: the legacy, straddling result is outside it)."""
    from torch_cgx import CGXState, cgx_hook

    dist.init_process_group("cgx")
    gloo = dist.new_group(backend="gloo")
    results = {}
    for legacy in (False, True):
        model = Probe(SHAPES)
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        kw = {"legacy": True} if legacy else {"error_feedback": False, "rotation": False}
        state = CGXState(None, 1024, {"bits": 4, "bucket_size": 256}, **kw)
        ddp.register_comm_hook(state, cgx_hook)
        coeffs = coeffs_of(rank, 0)
        ddp(coeffs).backward()
        results[legacy] = model.w[0].grad.reshape(-1).clone()
    layer = coeffs[0].reshape(-1)
    pad = levers.padded(layer.numel(), 256, True) - layer.numel()
    padded = torch.cat([layer, layer[-1:].expand(pad)])
    everyone = gather(padded, gloo)
    bound = allreduce_error_bound(everyone, 4, 256, average=True)[: layer.numel()]
    exact = torch.stack(everyone).double().mean(0)[: layer.numel()]
    assert bool(((results[False].double() - exact).abs() <= bound).all())
    assert not bool(((results[True].double() - exact).abs() <= bound).all())
    dist.destroy_process_group()


def test_layer_aligned_buckets_bound_each_layer_alone():
    run_ranks(body_layers_bound, 2)


def body_adaptive(rank, world):
    """Adaptive bits: every rank chooses the same bits from different local gradients, within
    the budget, more bits for the layer with the larger ranges; results identical."""
    from torch_cgx import CGXState, cgx_hook

    dist.init_process_group("cgx")
    gloo = dist.new_group(backend="gloo")
    model = Probe(SHAPES)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    state = CGXState(None, 1024, {"bits": 3, "bucket_size": 128}, adaptive_bits=3.0,
                     adapt_every=2, module=model)  # fmt: skip
    ddp.register_comm_hook(state, cgx_hook)
    for step in range(5):
        coeffs = coeffs_of(rank, step)
        coeffs[0] *= 1 + rank  # the ranks' local errors differ
        ddp.zero_grad()
        ddp(coeffs).backward()
        for p in model.parameters():
            flat = p.grad.reshape(-1)
            assert torch.equal(torch.stack(gather(flat, gloo)).amin(0), flat)
    bits = state.layer_bits
    assert sorted(bits) == ["w.0", "w.1"], bits
    mine = torch.tensor([bits["w.0"], bits["w.1"]])
    assert all(torch.equal(o, mine) for o in gather(mine, gloo)), "ranks chose differently"
    sizes = {"w.0": 3201, "w.1": 3880}
    assert sum(bits[k] * n for k, n in sizes.items()) <= 3.0 * sum(sizes.values())
    assert bits["w.1"] > bits["w.0"]  # 50x the scale: (log2 50 ~ 5.6 bits of range) more bits
    dist.destroy_process_group()


def test_adaptive_bits_agree_across_ranks():
    run_ranks(body_adaptive, 2)


def body_rotation_needs_power_of_two(rank, world):
    import torch_cgx
    from torch_cgx import CGXState, cgx_hook

    dist.init_process_group("cgx")
    torch_cgx.set_config(bucket_size=1000)  # the group's bucket size: not a power of two
    model = Probe(SHAPES)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    ddp.register_comm_hook(CGXState(None, 1024, {"bits": 2}, rotation=True), cgx_hook)
    with pytest.raises(ValueError, match="power of two"):
        ddp(coeffs_of(rank, 0)).backward()
    dist.destroy_process_group()


def test_rotation_with_a_bad_group_bucket_size_raises():
    run_ranks(body_rotation_needs_power_of_two, 2)


def body_clip(rank, world):
    """2 bits, rotated: the clipped range gives replicas that agree bit for bit and a smaller
    error against the exact mean (theory, one quantization of Gaussian values: 0.34x the squared
    error; SRA quantizes twice, the padding and the mean estimate cost a little)."""
    from torch_cgx import CGXState, cgx_hook

    dist.init_process_group("cgx")
    gloo = dist.new_group(backend="gloo")
    coeffs = [torch.randn(s, generator=torch.Generator().manual_seed(rank)) for s in SHAPES]
    exact = torch.stack(gather(coeffs[0].reshape(-1), gloo)).double().mean(0)
    err = {}
    for clip in (False, True):
        model = Probe(SHAPES)
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        ddp.register_comm_hook(CGXState(None, 1024, {"bits": 2}, clip=clip), cgx_hook)
        ddp(coeffs).backward()
        got = model.w[0].grad.reshape(-1)
        assert torch.equal(torch.stack(gather(got, gloo)).amin(0), got), "replicas differ"
        err[clip] = float((got.double() - exact).square().mean())
    assert err[True] < 0.6 * err[False], err
    dist.destroy_process_group()


def test_clip_lowers_the_error_of_rotated_2_bit_buckets():
    run_ranks(body_clip, 2)


def body_adaptive_last_bucket_exact(rank, world):
    """Adaptive bits where DDP's last bucket holds only an exactly reduced layer (a bias first
    in the model, every layer its own bucket): the choice is still made, the same everywhere."""
    from torch_cgx import CGXState, cgx_hook

    dist.init_process_group("cgx")
    gloo = dist.new_group(backend="gloo")
    shapes = [(64,), (600, 600), (300, 600)]  # each over DDP's 1 MiB first bucket
    model = Probe(shapes)
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1)
    state = CGXState(None, 1024, {"bits": 3}, adaptive_bits=3.0, adapt_every=2, module=model)
    ddp.register_comm_hook(state, cgx_hook)
    g = torch.Generator().manual_seed(rank)
    for step in range(5):  # adapts at steps 0, 2, 4; DDP splits the buckets after step 0
        big = 2 if step < 3 else 1  # the layer with 10x the scale: w.2, then w.1 from step 3
        ddp.zero_grad()
        ddp([torch.randn(s, generator=g) * (10 if i == big else 1)
             for i, s in enumerate(shapes)]).backward()  # fmt: skip
        if step in (2, 4):
            mine = torch.tensor([state.layer_bits["w.1"], state.layer_bits["w.2"]])
            assert all(torch.equal(o, mine) for o in gather(mine, gloo)), "ranks differ"
            assert (mine[1] > mine[0]) == (step == 2), (step, mine)  # more bits to the large one
    dist.destroy_process_group()


def test_adaptive_bits_when_the_last_bucket_is_exact():
    run_ranks(body_adaptive_last_bucket_exact, 2)
