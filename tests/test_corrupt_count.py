"""A payload whose element count was corrupted in transit (one byte of a 40-byte dgc
payload's count can make it describe 2.06e9 values, 8 GB). A receiver that passes the count it
expects (``decode(p, out=...)``, and every receiver inside the backend: C++ tests in
csrc/tests/corrupt_count_test.cc and reduce_scatter_test.cc) raises ValueError; ``decode(p)``
without ``out=`` trusts the header (docs/FORMAT.md, "Who decides the count") but refuses any
count a dense payload's body cannot hold, before allocating."""

from __future__ import annotations

import time

import pytest
import torch

from torch_cgx import compressors

# Where each format keeps its u64 count: max-min's header at 16, the envelope at 8.
_COUNT_AT = {"maxmin": 16}


def _corrupt_count(name: str, payload: torch.Tensor) -> torch.Tensor:
    """The count's fourth byte XOR 0x7a: 100 values become about 2.05e9."""
    bad = payload.clone()
    bad[_COUNT_AT.get(name, 8) + 3] ^= 0x7A
    return bad


def _payload(name: str) -> torch.Tensor:
    return compressors.get(name).encode(
        torch.randn(100, generator=torch.Generator().manual_seed(1))
    )


@pytest.mark.parametrize("name", compressors.names())
def test_a_corrupt_count_raises_where_the_count_is_expected(name):
    c = compressors.get(name)
    bad = _corrupt_count(name, _payload(name))
    with pytest.raises(ValueError):
        c.decode(bad, out=torch.empty(100))
    with pytest.raises(ValueError):
        c.decode_add_(torch.zeros(100), bad)


@pytest.mark.parametrize(
    "name", [n for n in compressors.names() if not compressors.get(n).traits["sparse"]]
)
def test_decode_without_out_refuses_what_a_dense_body_cannot_hold(name):
    c = compressors.get(name)
    bad = _corrupt_count(name, _payload(name))
    start = time.monotonic()
    with pytest.raises(ValueError):
        c.decode(bad)  # no 8 GB tensor first
    assert time.monotonic() - start < 1.0


@pytest.mark.parametrize("name", ["dgc", "graddrop"])
def test_a_sparse_header_is_trusted_without_out(name):
    """The issue's payload: 40 bytes, one pair. Its count is all a decode without out= has
    (documented); numel() shows it, so a receiver can compare before allocating."""
    p = _payload(name)
    assert p.numel() == 40
    bad = _corrupt_count(name, p)
    assert compressors.get(name).numel(bad) > 2**30
    assert compressors.get(name).numel(p) == 100
