"""The settings table (torch_cgx/settings.py) is the one source: the typed config, the native
defaults and copying, the environment readers, Options and docs/settings.md all follow it."""

from __future__ import annotations

import dataclasses
import pathlib

import pytest

from torch_cgx import _C, settings, settings_doc
from torch_cgx.config import CGXConfig, Options

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_docs_reference_is_generated_from_the_table():
    text = (ROOT / "docs" / "settings.md").read_text()
    assert text == settings_doc.markdown(), "docs/settings.md is stale: run `make settings-doc`"
    for s in settings.SETTINGS:
        assert f"| `{s.name}`" in text and s.env in text


def test_config_fields_are_the_group_settings_in_table_order():
    fields = [(f.name, f.default) for f in dataclasses.fields(CGXConfig)]
    assert fields == [(s.name, s.default) for s in settings.GROUP_SETTINGS]


def test_native_defaults_equal_the_table():
    native = _C.BackendConfig()
    for s in settings.GROUP_SETTINGS:
        want = s.to_native(s.default)
        if s.name == "compressor_params":
            want = {}
        assert getattr(native, s.native) == want, s.name
    assert CGXConfig.from_native(native) == CGXConfig()


def test_every_setting_round_trips_through_native():
    c = CGXConfig(bits=3, bucket_size=256, skip_incomplete_buckets=True, min_size=100,
                  fusion_buffer_mb=8, algorithm="tree", pipeline_segment_mb=0, stochastic=True,
                  rotation="on", clip="off", seed=2**63, settings_per_call=False,
                  hierarchical="on", intra_broadcast=False, inner_communicator="shm",
                  cross_communicator="gloo", intra_compress="bf16")  # fmt: skip
    assert CGXConfig.from_native(c.to_native()) == c
    t = CGXConfig(compressor="topk", compressor_params={"ratio": 0.25})
    assert t.compressor_params == "ratio=0.25"
    assert CGXConfig.from_native(t.to_native()) == t


def test_each_variable_is_read_and_typed():
    env = {"CGX_COMPRESSION_QUANTIZATION_BITS": "4", "CGX_COMPRESSION_MINIMAL_SIZE": "7",
           "CGX_FUSION_BUFFER_SIZE_MB": "3", "CGX_INNER_REDUCTION_TYPE": "Ring",
           "CGX_COMPRESSOR_PARAMS": ""}  # fmt: skip
    values, names = settings.read_env(("creation", "group", "call"), env)
    assert values == {"bits": 4, "min_size": 7, "fusion_buffer_mb": 3, "algorithm": "ring"}
    assert names["algorithm"] == "CGX_INNER_REDUCTION_TYPE"
    c = CGXConfig.from_env(env)
    assert (c.bits, c.min_size, c.minimal_size, c.algorithm) == (4, 7, 7, "ring")


def test_scopes_are_known_and_process_settings_are_not_per_group():
    assert {s.scope for s in settings.SETTINGS} <= set(settings.SCOPES)
    assert settings.CALL_SETTINGS == ("bits", "bucket_size", "skip_incomplete_buckets")
    with pytest.raises(ValueError, match="per process"):
        CGXConfig().replace(codec_threads=2)
    with pytest.raises(ValueError, match="codec_threads is per process"):
        Options(codec_threads=2)


def test_options_validate_at_once_and_win_over_the_environment():
    with pytest.raises(ValueError, match="bits must be 1..8"):
        Options(bits=12)
    with pytest.raises(ValueError, match="unknown cgx setting 'bitz'"):
        Options(bitz=4)
    o = Options(bits=4, minimal_size=0)  # the old name is accepted
    assert o.settings == {"bits": 4, "min_size": 0}
    c = o.config({"CGX_COMPRESSION_QUANTIZATION_BITS": "8", "CGX_COMPRESSION_BUCKET_SIZE": "64"})
    assert (c.bits, c.bucket_size, c.min_size) == (4, 64, 0)


def test_a_setting_that_does_nothing_is_refused():
    with pytest.raises(ValueError, match="CGX_CROSS_COMMUNICATOR_TYPE MPI would do nothing"):
        CGXConfig.from_env({"CGX_CROSS_COMMUNICATOR_TYPE": "MPI"})
    assert CGXConfig.from_env({"CGX_CROSS_COMMUNICATOR_TYPE": "GLOO"}).cross_communicator == "gloo"
    with pytest.raises(ValueError, match="CGX_COMPRESSION_ROTATION=on would do nothing"):
        CGXConfig.from_env({"CGX_COMPRESSOR": "topk", "CGX_COMPRESSION_ROTATION": "on"})
    with pytest.raises(ValueError, match="clip=on would do nothing"):
        Options(compressor="fp16", clip="on").config({})


def body_pg_options(rank, world):
    import torch
    import torch.distributed as dist

    import torch_cgx

    # No CGX_* variable is set: the world's settings come from Options alone.
    dist.init_process_group("cgx", pg_options=torch_cgx.Options(bits=4, bucket_size=64))
    c = torch_cgx.get_config()
    assert (c.bits, c.bucket_size, c.algorithm) == (4, 64, "sra")
    sub = dist.new_group([0, 1], backend="cgx", pg_options=torch_cgx.Options(bits=8, min_size=0))
    assert (torch_cgx.get_config(sub).bits, torch_cgx.get_config(sub).min_size) == (8, 0)
    plain = dist.new_group([0, 1], backend="cgx")  # no options: the environment's (defaults)
    assert torch_cgx.get_config(plain).bits == 32
    # Compression happens: 4-bit max-min of 4096 values sends far fewer bytes than fp32.
    t = torch.full((4096,), float(rank + 1))
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((4096,), 3.0))  # constant buckets are exact
    assert 0 < torch_cgx.cgx_backend().last_bytes_sent() < 4096 * 4 / 4
    try:
        dist.new_group([0, 1], backend="cgx", pg_options={"bits": 4})
        raise AssertionError("a dict was accepted as pg_options")
    except TypeError as e:
        assert "torch_cgx.Options" in str(e)
    dist.destroy_process_group()


def test_group_created_with_typed_options_and_no_environment():
    from dist_helpers import run_ranks

    run_ranks(body_pg_options, 2, timeout=120)
