"""hivemind's Lightning code blocks (the seed page), with only their import lines changed, on
two peers (processes) per block around a Lighthouse of this test: both train, epochs advance,
and the parameters after every epoch both peers saw are bitwise equal."""

from __future__ import annotations

import os

import collaborative_lightning_peer
import pytest
import torch
import torch.multiprocessing as mp
from dist_helpers import context_start_method

pytest.importorskip("torchft")
pytest.importorskip("pytorch_lightning")

STEPS = 48  # batches of 8 per peer and block


@pytest.mark.timeout(300)
def test_seed_blocks_on_two_peers(tmp_path):
    from torch_cgx.collaborative import Lighthouse

    houses = [Lighthouse("127.0.0.1", join_timeout=3.0, heartbeat_timeout=1.0) for _ in range(3)]
    addresses = [h.address for h in houses]
    ctx = mp.get_context(context_start_method())
    procs = [ctx.Process(target=collaborative_lightning_peer.run,
                         args=(str(tmp_path), peer, addresses, STEPS, seed), daemon=True)
             for peer, seed in (("a", 0), ("b", 1))]  # fmt: skip
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.join(280)
            assert p.exitcode == 0, p.exitcode
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        for h in houses:
            h.shutdown()
    for block in range(3):
        a, b = (os.path.join(tmp_path, str(block), peer) for peer in "ab")
        both = []
        for e in sorted(set(os.listdir(a)) & set(os.listdir(b))):
            pa, pb = torch.load(os.path.join(a, e)), torch.load(os.path.join(b, e))
            if pa.pop("peers") == pb.pop("peers") == 2:  # an epoch of the two together
                both.append((e, pa, pb))
        assert len(both) >= 2, (block, os.listdir(a), os.listdir(b))
        for e, pa, pb in both:
            for key in pa:
                assert torch.equal(pa[key], pb[key]), (block, e, key)
