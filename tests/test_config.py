"""CGX_* variables and the typed settings: CGX's defaults, clear errors naming the variable."""

from __future__ import annotations

import pytest

from torch_cgx.config import CGXConfig


def test_defaults_are_cgx_defaults():
    c = CGXConfig.from_env({})
    assert (c.bits, c.bucket_size, c.skip_incomplete_buckets, c.fusion_buffer_mb) == (
        32,
        512,
        False,
        64,
    )
    assert c.algorithm == "sra" and not c.compressed and c.minimal_size == 16


def test_env_values_are_read():
    c = CGXConfig.from_env(
        {
            "CGX_COMPRESSION_QUANTIZATION_BITS": "4",
            "CGX_COMPRESSION_BUCKET_SIZE": "1024",
            "CGX_COMPRESSION_SKIP_INCOMPLETE_BUCKETS": "1",
            "CGX_COMPRESSION_MINIMAL_SIZE": "0",
            "CGX_FUSION_BUFFER_SIZE_MB": "8",
            "CGX_REDUCTION_ALGORITHM": "Ring",
            "CGX_COMPRESSION_STOCHASTIC": "true",
            "CGX_COMPRESSION_SEED": "7",
            "CGX_PIPELINE_SEGMENT_MB": "0",
        }
    )
    assert c == CGXConfig(
        bits=4, bucket_size=1024, skip_incomplete_buckets=True, minimal_size=0,
        fusion_buffer_mb=8, algorithm="ring", stochastic=True, seed=7, pipeline_segment_mb=0,
    )  # fmt: skip
    assert CGXConfig.from_env({"CGX_INNER_REDUCTION_TYPE": "SRA"}).algorithm == "sra"
    assert CGXConfig.from_env({"CGX_INNER_REDUCTION_TYPE": "Ring"}).algorithm == "ring"


@pytest.mark.parametrize(
    "var, value",
    [
        ("CGX_COMPRESSION_QUANTIZATION_BITS", "0"),
        ("CGX_COMPRESSION_QUANTIZATION_BITS", "9"),
        ("CGX_COMPRESSION_QUANTIZATION_BITS", "31"),
        ("CGX_COMPRESSION_QUANTIZATION_BITS", "four"),
        ("CGX_COMPRESSION_BUCKET_SIZE", "0"),
        ("CGX_COMPRESSION_BUCKET_SIZE", "-5"),
        ("CGX_COMPRESSION_MINIMAL_SIZE", "-1"),
        ("CGX_FUSION_BUFFER_SIZE_MB", "-64"),
        ("CGX_FUSION_BUFFER_SIZE_MB", "0"),
        ("CGX_REDUCTION_ALGORITHM", "tree"),
        ("CGX_INNER_REDUCTION_TYPE", "butterfly"),
        ("CGX_COMPRESSION_SKIP_INCOMPLETE_BUCKETS", "2"),
        ("CGX_COMPRESSION_SEED", "-1"),
        ("CGX_PIPELINE_SEGMENT_MB", "-8"),
    ],
)
def test_bad_env_value_names_the_variable(var, value):
    with pytest.raises(ValueError, match=var):
        CGXConfig.from_env({var: value})


def test_typed_api_validates_and_names_the_field():
    with pytest.raises(ValueError, match="bits"):
        CGXConfig(bits=12)
    with pytest.raises(ValueError, match="bucket_size"):
        CGXConfig(bits=4, bucket_size=0)
    with pytest.raises(ValueError, match="algorithm"):
        CGXConfig().replace(algorithm="allgather")
    with pytest.raises(ValueError, match="unknown cgx setting"):
        CGXConfig().replace(bitz=4)
    native = CGXConfig(bits=2, fusion_buffer_mb=3, algorithm="ring").to_native()
    assert (native.bits, native.fusion_buffer_bytes, native.algorithm) == (2, 3 << 20, 1)
