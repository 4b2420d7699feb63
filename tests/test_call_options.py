"""Per-call options (`_C.CallOptions`) and the one rotation / clip rule: the rule table, validation
at construction, cheap copies that change only the stream, and on 2 real ranks
`allreduce_call` giving the bytes `allreduce_with` gives, and `settings_version` moving with the
group's settings."""

from __future__ import annotations

import copy

import pytest
import torch
from dist_helpers import run_ranks

from torch_cgx import _C


def native(**fields) -> _C.BackendConfig:
    c = _C.BackendConfig()
    for name, value in fields.items():
        setattr(c, name, value)
    return c


# (rotation, bits, bucket_size, compressor) -> rotates
ROTATION_TABLE = [
    ("off", 4, 512, "maxmin", False),
    ("auto", 4, 512, "maxmin", True),
    ("auto", 1, 2, "maxmin", True),
    ("auto", 5, 512, "maxmin", False),  # auto rotates at 1-4 bits only
    ("auto", 8, 1024, "maxmin", False),
    ("auto", 4, 500, "maxmin", False),  # not a power of two
    ("auto", 4, 1, "maxmin", False),  # below 2
    ("auto", 4, 2**21, "maxmin", False),  # above 2^20
    ("on", 8, 1024, "maxmin", True),  # on: any bits
    ("on", 4, 512, "topk", False),  # max-min only
    ("auto", 4, 512, "qsgd", False),
]


@pytest.mark.parametrize("rotation,bits,bucket,compressor,expected", ROTATION_TABLE)
def test_rotation_rule(rotation, bits, bucket, compressor, expected):
    assert _C.rotation_rule(rotation, bits, bucket, compressor) is expected


@pytest.mark.parametrize(
    "clip,rotates,expected",
    [
        ("auto", True, True),
        ("auto", False, False),
        ("on", False, True),
        ("on", True, True),
        ("off", True, False),
        ("off", False, False),
    ],
)
def test_clip_rule(clip, rotates, expected):
    assert _C.clip_rule(clip, rotates) is expected


@pytest.mark.parametrize("rotation,bits,bucket,compressor,expected", ROTATION_TABLE)
def test_call_options_resolve_the_rule(rotation, bits, bucket, compressor, expected):
    c = native(rotation=rotation, bits=bits, bucket_size=bucket, compressor=compressor)
    if rotation == "on" and compressor != "maxmin":
        c.rotation = "auto"  # validation accepts "on" for any compressor; keep the case simple
    o = _C.CallOptions(c)
    assert o.rotates is expected
    # The clipped range follows the rotation by default, for max-min only.
    assert o.clips is (expected and compressor == "maxmin")
    c.clip = "on"
    assert _C.CallOptions(c).clips is (compressor == "maxmin")
    c.clip = "off"
    assert _C.CallOptions(c).clips is False


@pytest.mark.parametrize(
    "fields,compressed",
    [
        ({"bits": 32}, False),
        ({"bits": 8}, True),
        ({"bits": 1}, True),
        ({"bits": 32, "compressor": "topk", "compressor_params": {"ratio": 0.1}}, True),
        ({"compressor": "auto"}, False),
    ],
)
def test_call_options_compressed(fields, compressed):
    assert _C.CallOptions(native(**fields)).compressed is compressed


@pytest.mark.parametrize(
    "fields,field",
    [
        ({"bits": 9}, "bits"),
        ({"bits": 0}, "bits"),
        ({"bucket_size": 0}, "bucket_size"),
        ({"minimal_size": -1}, "minimal_size"),
        ({"rotation": "sometimes"}, "rotation"),
        ({"rotation": "on", "bucket_size": 500}, "rotation"),
        ({"clip": "maybe"}, "clip"),
        ({"compressor": "nonesuch"}, "nonesuch"),
        ({"compressor": "topk", "compressor_params": {"ratio": 2.0}}, "ratio"),
    ],
)
def test_call_options_validate_once(fields, field):
    with pytest.raises(ValueError, match=field):
        _C.CallOptions(native(**fields))


def test_stream_copies_change_only_the_stream():
    o = _C.CallOptions(native(bits=4, rotation="auto", bucket_size=256, seed=7))
    assert o.stream == -1
    s = o.with_stream(12)
    assert (s.stream, o.stream) == (12, -1)
    c = copy.copy(o)
    c.stream = 3
    assert (c.stream, o.stream) == (3, -1)
    for x in (s, c):
        assert (x.compressed, x.rotates, x.clips) == (o.compressed, o.rotates, o.clips)
        assert x.config.bits == 4 and x.config.seed == 7 and x.config.bucket_size == 256
    with pytest.raises(ValueError, match="stream"):
        o.with_stream(-2)


def _call_vs_with(rank, world):
    import torch.distributed as dist

    import torch_cgx

    dist.init_process_group("cgx")
    backend = torch_cgx.cgx_backend()
    v0 = backend.settings_version()
    for fields in (
        {"bits": 4, "bucket_size": 128, "rotation": "auto", "seed": 3},
        {"bits": 3, "bucket_size": 100},
        {"bits": 32, "compressor": "topk", "compressor_params": {"ratio": 0.25}},
        {"bits": 32},
    ):
        config = native(**fields)
        options = _C.CallOptions(config).with_stream(5)
        config.stream = 5
        g = torch.Generator().manual_seed(rank)
        x = torch.randn(1000, generator=g)
        a, b = x.clone(), x.clone()
        ra, rb = torch.empty(1000), torch.empty(1000)
        backend.allreduce_with(a, config, True, ra).wait()
        backend.allreduce_call(b, options, True, rb).wait()
        assert torch.equal(a, b), fields
        assert torch.equal(ra, rb), fields
    # Only changes of the group's settings move the version.
    assert backend.settings_version() == v0
    torch_cgx.set_config(bits=4)
    v1 = backend.settings_version()
    assert v1 > v0
    backend.set_plan([])
    assert backend.settings_version() > v1
    dist.destroy_process_group()


def test_allreduce_call_matches_allreduce_with():
    run_ranks(_call_vs_with, 2)
