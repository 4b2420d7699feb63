"""The short torture run (tests/torture_ops.py): 4 ranks, a few hundred random collectives,
every result checked; the long run is `python tests/torture_ops.py --ops 5000`."""

from __future__ import annotations

import pytest
import torture_ops
from dist_helpers import run_ranks


def test_every_kind_is_implemented():
    torture_ops._install_ops()
    missing = [k for k in torture_ops.KINDS if not hasattr(torture_ops.Torture, "op_" + k)]
    assert not missing


@pytest.mark.parametrize("seed", [1, 2])
def test_random_collectives_on_four_ranks(seed):
    run_ranks(torture_ops.body, 4, seed, 400, timeout=240)
