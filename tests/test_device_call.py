"""torch_cgx/device/call.py: the chunk alignment of a call whose compressor parameters are left
to their defaults is the codec's own bucket size, as the native engine's (payload.cc
``chunk_alignment``); found by scripts/gpu_check.sh's two-rank step (qsgd, onebit and terngrad
on SRA and ring differed from the native engine whenever a chunk was not a multiple of 512)."""

from __future__ import annotations

import pytest

import torch_cgx
from torch_cgx.device import codecs
from torch_cgx.device.call import DeviceCall, resolve


@pytest.mark.parametrize("name", ["qsgd", "onebit", "terngrad", "efsignsgd"])
@pytest.mark.parametrize("params", ["", "bucket_size=128"])
def test_alignment_is_the_codecs_bucket_size(name, params):
    config = torch_cgx.CGXConfig(compressor=name, compressor_params=params)
    plan = resolve(DeviceCall.from_config(config, True), codecs.get)
    bucket = codecs.get(name, **({"bucket_size": 128} if params else {})).bucket_size
    assert plan.alignment == max(1, bucket)
    if not params and name != "efsignsgd":  # efsignsgd's default is one bucket per tensor
        assert plan.alignment > 1
