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
    assert c.algorithm == "sra" and not c.compressed and c.min_size == 16


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
        bits=4, bucket_size=1024, skip_incomplete_buckets=True, min_size=0,
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
        ("CGX_REDUCTION_ALGORITHM", "butterfly"),
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
        CGXConfig().replace(algorithm="butterfly")
    with pytest.raises(ValueError, match="unknown cgx setting"):
        CGXConfig().replace(bitz=4)
    native = CGXConfig(bits=2, fusion_buffer_mb=3, algorithm="ring").to_native()
    assert (native.bits, native.fusion_buffer_bytes, native.algorithm) == (2, 3 << 20, 1)
    assert CGXConfig.from_native(native) == CGXConfig(bits=2, fusion_buffer_mb=3, algorithm="ring")


def test_codec_threads_share_the_host_among_its_ranks():
    from torch_cgx.settings import ProcessSettings, process_settings, usable_cores

    cores = usable_cores()
    assert process_settings({}) == ProcessSettings(cores, True)
    assert process_settings({"LOCAL_WORLD_SIZE": "2"}).codec_threads == max(1, cores // 2)
    assert process_settings({"LOCAL_WORLD_SIZE": str(4 * cores)}).codec_threads == 1
    assert process_settings({"CGX_CODEC_THREADS": "3", "LOCAL_WORLD_SIZE": "8"}).codec_threads == 3
    assert process_settings({"CGX_DISABLE_AVX2": "1"}).avx2 is False


@pytest.mark.parametrize(
    "var, value",
    [
        ("CGX_CODEC_THREADS", "many"),
        ("CGX_CODEC_THREADS", "0"),
        ("CGX_CODEC_THREADS", "2000"),
        ("CGX_DISABLE_AVX2", "maybe"),
        ("LOCAL_WORLD_SIZE", "0"),
    ],
)
def test_bad_process_setting_names_the_variable(var, value):
    from torch_cgx.settings import process_settings

    with pytest.raises(ValueError, match=var):
        process_settings({var: value})


def test_import_applies_process_settings_and_rejects_bad_ones():
    import os
    import subprocess
    import sys

    def run(**env):
        code = "import torch_cgx; print(torch_cgx.codec.num_threads(), torch_cgx._C.isa())"
        full = {k: v for k, v in os.environ.items() if not k.startswith("CGX_")}
        full.update(env)
        return subprocess.run(
            [sys.executable, "-c", code], env=full, capture_output=True, text=True
        )

    ok = run(CGX_CODEC_THREADS="3", CGX_DISABLE_AVX2="1")
    assert ok.returncode == 0 and ok.stdout.split() == ["3", "generic"], ok.stderr
    bad = run(CGX_CODEC_THREADS="lots")
    assert bad.returncode != 0 and "ValueError: CGX_CODEC_THREADS must be an integer" in bad.stderr


def test_mpirun_local_size_maps_to_local_world_size():
    from torch_cgx.launch import apply_launcher_env

    env = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4"}
    env["OMPI_COMM_WORLD_LOCAL_SIZE"] = "2"
    assert apply_launcher_env(env) and env["LOCAL_WORLD_SIZE"] == "2"
