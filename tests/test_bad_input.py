"""Bad input, all of it: every setting malformed or differing across ranks, and tensors that are
non-contiguous, 0-dim, empty, on the meta device, of mixed devices, or larger than 2^31 elements.
Each gives a clear exception naming the problem, or the right result; nothing a user gave is
lost (docs/reliability.md, section 5)."""

from __future__ import annotations

import gc

import pytest
import torch
import torch.distributed as dist
from dist_helpers import run_ranks

from torch_cgx.config import CREATION_ONLY, CGXConfig
from torch_cgx.settings import GROUP_SETTINGS

_ENV = {s.name: s.env for s in GROUP_SETTINGS}

# One malformed value per variable (the test below checks that every variable has one).
MALFORMED = {
    "CGX_COMPRESSION_QUANTIZATION_BITS": "x",
    "CGX_COMPRESSION_BUCKET_SIZE": "1.5",
    "CGX_COMPRESSION_SKIP_INCOMPLETE_BUCKETS": "yes please",
    "CGX_COMPRESSION_MINIMAL_SIZE": "-3",
    "CGX_FUSION_BUFFER_SIZE_MB": "lots",
    "CGX_REDUCTION_ALGORITHM": "butterfly",
    "CGX_PIPELINE_SEGMENT_MB": "-1",
    "CGX_COMPRESSION_STOCHASTIC": "2",
    "CGX_COMPRESSION_SEED": "1e3",
    "CGX_COMPRESSOR": "zip",
    "CGX_COMPRESSOR_PARAMS": "ratio",
    "CGX_SETTINGS_PER_CALL": "sometimes",
    "CGX_HIERARCHICAL": "maybe",
    "CGX_INTRA_BROADCAST": "3",
    "CGX_INNER_COMMUNICATOR_TYPE": "carrier-pigeon",
    "CGX_CROSS_COMMUNICATOR_TYPE": "x",
    "CGX_INTRA_COMPRESS": "int3",
    "CGX_COMPRESSION_ROTATION": "sideways",
    "CGX_COMPRESSION_CLIP": "half",
    "CGX_DATA_PLANE": "gpu",
}


def test_every_variable_has_a_malformed_case():
    assert set(MALFORMED) == set(_ENV.values())


@pytest.mark.parametrize("var", sorted(MALFORMED))
def test_malformed_variable_is_named(var):
    with pytest.raises(ValueError, match=var):
        CGXConfig.from_env({var: MALFORMED[var]})


def test_compressor_parameter_unknown_or_malformed_is_named():
    with pytest.raises(ValueError, match="topk has no parameter 'nonsense'"):
        CGXConfig.from_env({"CGX_COMPRESSOR": "topk", "CGX_COMPRESSOR_PARAMS": "nonsense=1"})
    with pytest.raises(ValueError, match="CGX_COMPRESSOR_PARAMS"):
        CGXConfig.from_env({"CGX_COMPRESSOR": "topk", "CGX_COMPRESSOR_PARAMS": "ratio=abc"})


# Two valid values per setting that set_config changes: rank 0 asks for the first, rank 1 for
# the second.
DIFFERING = {
    "bits": (4, 8),
    "bucket_size": (128, 512),
    "skip_incomplete_buckets": (False, True),
    "min_size": (16, 32),
    "fusion_buffer_mb": (64, 32),
    "algorithm": ("sra", "ring"),
    "pipeline_segment_mb": (0, 4),
    "stochastic": (False, True),
    "seed": (1, 2),
    "compressor": ("maxmin", "fp16"),
    "compressor_params": ("ratio=0.1", "ratio=0.2"),  # with compressor="topk" on both
    "settings_per_call": (True, False),
    "rotation": ("off", "auto"),
    "clip": ("auto", "on"),
}


def body_differing(rank, world):
    import torch_cgx

    dist.init_process_group("cgx")
    before = torch_cgx.get_config()
    for field, values in DIFFERING.items():
        extra = {"compressor": "topk"} if field == "compressor_params" else {}
        with pytest.raises(ValueError, match="differ between ranks"):
            torch_cgx.set_config(**{field: values[rank]}, **extra)
        assert torch_cgx.get_config() == before, field  # nothing applied on any rank
    torch_cgx.set_config(bits=4)  # the group still agrees and works
    t = torch.ones(1000)
    dist.all_reduce(t)
    assert torch.equal(t, torch.full_like(t, float(world)))
    dist.destroy_process_group()


def test_every_setting_differing_across_ranks_raises_everywhere():
    assert set(DIFFERING) | set(CREATION_ONLY) == set(_ENV)
    run_ranks(body_differing, 2, timeout=120)


def body_creation_only_differing(rank, world):
    import os

    os.environ["CGX_INTRA_BROADCAST"] = str(rank)
    with pytest.raises(ValueError, match="differ"):
        dist.init_process_group("cgx")


def test_creation_setting_differing_raises_at_init():
    run_ranks(body_creation_only_differing, 2, timeout=120)


def body_tensors(rank, world):
    import torch_cgx

    dist.init_process_group("cgx")
    gloo = dist.new_group(backend="gloo")
    torch_cgx.set_config(bits=4, bucket_size=64, minimal_size=0)
    g = torch.Generator().manual_seed(rank)
    # Non-contiguous: reduced in place, through the view, as its contiguous copy is.
    base = torch.randn(64, 48, generator=g)
    view, copy = base.t(), base.t().contiguous()
    dist.all_reduce(view)
    dist.all_reduce(copy)
    assert torch.equal(view, copy) and not torch.equal(copy, torch.randn(64, 48).t())
    # 0-dim and empty tensors: exact results, no error.
    s = torch.tensor(float(rank + 1))
    dist.all_reduce(s)
    assert s.item() == world * (world + 1) / 2
    e = torch.empty(0)
    dist.all_reduce(e)
    assert e.numel() == 0
    # The hooks' entry point refuses tensors with no data, and names the device.
    backend, native = torch_cgx.cgx_backend(), torch_cgx.get_config().to_native()
    with pytest.raises(ValueError, match="meta"):
        backend.allreduce_with(torch.empty(100, device="meta"), native, True)
    with pytest.raises(ValueError, match="floating-point"):
        backend.allreduce_with(torch.ones(100, dtype=torch.int32), native, True)
    # Mixed devices in one coalesced call: torch's error, before anything is sent.
    with pytest.raises((RuntimeError, NotImplementedError, ValueError)):
        dist.all_reduce_coalesced([torch.ones(100), torch.empty(10, device="meta")])
    # A reduce-scatter whose sizes do not match: the error names both sizes.
    with pytest.raises(RuntimeError, match="130 vs. 128"):
        dist.reduce_scatter_tensor(torch.empty(65), torch.randn(128))
    # A tensor whose elements alias (expand): refused, not summed into one location W times.
    with pytest.raises(RuntimeError, match="single memory location"):
        dist.all_reduce(torch.zeros(1).expand(1000))
    t = torch.ones(1000)  # the group is still in step on every rank
    dist.all_reduce(t, group=gloo)
    dist.all_reduce(t)
    assert torch.equal(t, torch.full_like(t, float(world * world)))
    gc.collect()
    dist.destroy_process_group()


def test_odd_tensors_on_a_compressing_group():
    run_ranks(body_tensors, 2, timeout=120)


def test_more_than_2_pow_31_elements_round_trip():
    """2^31 + 7 bf16 values (4.3 GB) through the max-min codec: the count and the last values
    survive (no 32-bit index anywhere on the way); about 5 s and 5.5 GB."""
    from torch_cgx import compressors

    n = 2**31 + 7
    x = torch.zeros(n, dtype=torch.bfloat16)
    x[-3:] = torch.tensor([1.0, -2.0, 3.0])
    codec = compressors.get("maxmin", bits=4, bucket_size=1024)
    payload = codec.encode(x)
    assert payload.numel() == codec.encoded_size(n)
    del x
    y = codec.decode(payload, dtype=torch.bfloat16)
    assert y.numel() == n and y[-3:].tolist() == [1.0, -2.0, 3.0]
    assert not y[: n - 1024].any()  # the all-zero buckets decode to zeros
