"""A rank for tests/test_hosts.py, run inside an emulated host with `python -m hosts_worker`.

hosts_worker allreduce    init_process_group('cgx'), one 4-bit all_reduce, checked
hosts_worker fail R CODE  rank R exits CODE at once; the others hang (to be killed)
"""

from __future__ import annotations

import os
import sys
import time


def main(argv) -> int:
    rank = int(os.environ["RANK"])
    if argv[0] == "fail":
        if rank == int(argv[1]):
            return int(argv[2])
        time.sleep(120)  # a rank waiting for a dead peer: run_on_hosts must kill it
        return 0
    import torch
    import torch.distributed as dist

    import torch_cgx

    dist.init_process_group("cgx")
    world = dist.get_world_size()
    torch_cgx.set_config(bits=4, bucket_size=512)
    n = 1 << 16
    x = torch.linspace(-1, 1, n) * (rank + 1)
    dist.all_reduce(x)
    expected = torch.linspace(-1, 1, n) * (world * (world + 1) / 2)
    err = float((x - expected).abs().max())
    # Two quantizations of buckets whose ranges sum to at most 2 * 3 * 512 * 2 / n: tiny.
    assert err < 1e-2, err
    sent = torch_cgx.cgx_backend().last_bytes_sent()
    assert 0 < sent < n * 4 / 4, sent  # compressed: far below the fp32 bytes
    print(f"rank {rank}: ok via {os.environ['MASTER_ADDR']} err {err:.2e} sent {sent}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
