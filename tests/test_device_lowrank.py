"""PowerSGD's three passes (``torch_cgx.hooks.lowrank``) on the device path (torch operations,
what CUDA matrices take) against the native fused ones, within the bound derived from the two
sums' rounding; and the switch that sends CPU matrices down the device path
(docs/gpu-engine.md, "Entry points on the device"). ``python tests/test_device_lowrank.py`` times
both paths."""

from __future__ import annotations

import pytest
import torch

U = 2.0**-24  # fp32's unit roundoff


def gamma(n: int) -> float:
    """Higham's gamma_n = n u / (1 - n u): the relative bound of an n-term fp32 sum of products."""
    return n * U / (1 - n * U)


def _case(rows, cols, rank, seed):
    g = torch.Generator().manual_seed(seed)
    m = torch.randn(rows, cols, generator=g) * (1 + torch.arange(cols) % 5)
    e = torch.randn(rows, cols, generator=g) * 0.1
    q = torch.linalg.qr(torch.randn(cols, rank, generator=g))[0].contiguous()
    p = torch.randn(rows, rank, generator=g)
    return m, e, q, p


def _item(m, e, rank, add_error=True):
    from torch_cgx.hooks import lowrank

    it = lowrank.Item("w", m, rank, None)
    it.error, it.add_error = e, add_error
    return it


@pytest.mark.parametrize("rows,cols,rank", [(300, 700, 4), (1030, 129, 2), (64, 2000, 1)])
def test_lowrank_device_passes_within_the_rounding_bound(rows, cols, rank):
    """Each pass of the device path (torch ops) against the native fused one: the same steps, so
    the difference is the two sums' rounding: the native sums in fp32 over at most 64 terms
    (project: 8 lanes over 512-value blocks) or 256 rows (transpose), then in fp64; the device's
    fp32 products over all n terms. Each lies within gamma_n * sum |a_i b_i| (+ u |result| for
    the final rounding) of the exact value, so they differ by at most the sum of both bounds."""
    from torch_cgx.hooks import lowrank

    m, e, q, p = _case(rows, cols, rank, rows + cols)
    # P = (M + E) Q, the error added in place first
    md, pd, mn, pn = m.clone(), torch.empty(rows, rank), m.clone(), torch.empty(rows, rank)
    with lowrank.device_path():
        lowrank._project(_item(md, e, rank), q, pd)
    lowrank._project(_item(mn, e, rank), q, pn)
    assert torch.equal(md, mn)  # the same fp32 additions
    s = md.double().abs() @ q.double().abs()
    assert ((pd.double() - pn.double()).abs() <= (gamma(cols) + gamma(64) + U) * s).all()
    # Q = M^T P
    qd, qn = torch.empty(cols, rank), torch.empty(cols, rank)
    with lowrank.device_path():
        lowrank._transpose_project(_item(md, None, rank, False), p, qd)
    lowrank._transpose_project(_item(mn, None, rank, False), p, qn)
    s = md.double().abs().t() @ p.double().abs()
    assert ((qd.double() - qn.double()).abs() <= (gamma(rows) + gamma(256) + U) * s).all()
    # A = P Q^T, error = M - A, M = A
    ed, en = torch.empty(rows, cols), torch.empty(rows, cols)
    old = md.clone()
    with lowrank.device_path():
        lowrank._decompress(_item(md, ed, rank, False), p, q)
    lowrank._decompress(_item(mn, en, rank, False), p, q)
    assert torch.equal(ed, old - md)  # the error is what the new matrix left out, exactly
    s = p.double().abs() @ q.double().abs().t()
    bound = 2 * gamma(rank) * s
    assert ((md.double() - mn.double()).abs() <= bound).all()
    err_bound = bound * (1 + U) + U * (ed.double().abs() + en.double().abs())
    assert ((ed.double() - en.double()).abs() <= err_bound).all()


def test_lowrank_switch_restores_the_native_path():
    from torch_cgx.hooks import lowrank

    assert lowrank.NATIVE
    with pytest.raises(RuntimeError):
        with lowrank.device_path():
            assert not lowrank.NATIVE and not lowrank._fusable(torch.zeros(2, 2))
            raise RuntimeError("inside")
    assert lowrank.NATIVE and lowrank._fusable(torch.zeros(2, 2))


def bench_lowrank(rows=1024, cols=1024, rank=4, reps=5):
    import time

    from torch_cgx.hooks import lowrank

    m, e, q, p = _case(rows, cols, rank, 0)
    for name, native in (("device", False), ("native", True)):
        lowrank.NATIVE = native
        times = []
        for _ in range(reps):
            it = _item(m.clone(), e, rank)
            pp, qq = torch.empty(rows, rank), torch.empty(cols, rank)
            t = time.perf_counter()
            lowrank._project(it, q, pp)
            lowrank._transpose_project(it, p, qq)
            it.error = torch.empty_like(m)
            lowrank._decompress(it, p, q)
            times.append(time.perf_counter() - t)
        print(f"lowrank passes {name} ({rows}x{cols}, rank {rank}): "
              f"{sorted(times)[reps // 2] * 1e3:.2f} ms")  # fmt: skip
    lowrank.NATIVE = True


if __name__ == "__main__":
    torch.set_num_threads(1)
    bench_lowrank()
