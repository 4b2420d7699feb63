"""The wire formats of low-communication training, measured (docs/diloco-wire.md).

    python -m benchmarks.diloco_wire int8      # INTELLECT-1's int8 over mean +- 6 sd vs max-min
    python -m benchmarks.diloco_wire kept      # how sparseloco quantizes the kept values

``int8``: on heavy-tailed pseudo-gradient-like data (student-t with 3 and 5 degrees of freedom,
and a normal for reference; 2^20 values), the error of a pure numpy int8 quantizer over
``mean +- k sd`` (INTELLECT-1: k = 6; per tensor and per bucket, uniform, round to nearest,
values outside clamped) against torch_cgx's max-min codec at 8 bits (plain and with the clipped
range, ``clip``: width C[8] sd = 7.84 sd around the mean, docs/FORMAT.md "Clipped range").
Mean squared error relative to the data's variance, the largest error in sd, and bits per value.

``kept``: the rules considered for sparseloco's kept values (top-k of each 4096-value chunk,
3 %), numpy: a signed uniform grid over +-max |v|; sign + levels spread over [min, max] of the
kept |v| (the one chosen); sign + levels l * max / L; sign + levels from the mean |v|; and
Lloyd-Max levels (iterated, a lower bound for 2^(b-1) magnitudes); then the registered
compressor itself through torch_cgx.compressors. Squared error of the kept values relative to
the whole tensor's energy (what top-k alone drops is printed too).
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable, Dict, List, Optional

import numpy as np


def datasets(n: int = 1 << 20, seed: int = 0) -> Dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "normal": rng.standard_normal(n).astype(np.float32),
        "student-t 5": rng.standard_t(5, n).astype(np.float32),
        "student-t 3": rng.standard_t(3, n).astype(np.float32),
    }


def pseudo_gradient(steps: int = 30, seed: int = 0) -> np.ndarray:
    """A real DiLoCo pseudo-gradient: theta_0 - theta_H of the diloco benchmark's tiny GPT-2 after
    ``steps`` AdamW steps (lr 2e-3) in this process, all parameters concatenated."""
    import torch

    from benchmarks.diloco import parse_args
    from benchmarks.train_workloads import GPT2Workload

    args = parse_args([])
    wl = GPT2Workload(args, seed)
    torch.manual_seed(seed)
    model = wl.model()
    start = [p.detach().clone() for p in model.parameters()]
    opt = wl.optimizer(model.parameters())
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        wl.loss(model, wl.get_batch(step, 0)).backward()
        opt.step()
    delta = [(a - p.detach()).reshape(-1) for a, p in zip(start, model.parameters())]
    return torch.cat(delta).numpy().astype(np.float32)


# --- int8 over mean +- k sd (INTELLECT-1) ------------------------------------------------------


def sigma_int8(x: np.ndarray, k: float = 6.0, bucket: int = 0, bits: int = 8) -> np.ndarray:
    """Uniform 2^bits levels over [mean - k sd, mean + k sd] (per bucket; 0: the whole tensor),
    round to nearest, values outside clamped to the ends."""
    out = np.empty_like(x)
    step_n = bucket or len(x)
    levels = 2**bits - 1
    for lo in range(0, len(x), step_n):
        b = x[lo : lo + step_n].astype(np.float64)
        mean, sd = b.mean(), b.std()
        lo_v, width = mean - k * sd, 2 * k * sd
        if width == 0:
            out[lo : lo + step_n] = b
            continue
        q = np.clip(np.round((b - lo_v) / width * levels), 0, levels)
        out[lo : lo + step_n] = lo_v + q * width / levels
    return out


def maxmin(x: np.ndarray, bits: int = 8, bucket: int = 512, clip: bool = False) -> np.ndarray:
    import torch

    from torch_cgx import codec

    t = torch.from_numpy(x)
    return codec.decode(codec.encode(t, bits=bits, bucket_size=bucket, clip=clip)).numpy()


def _errors(x: np.ndarray, y: np.ndarray) -> tuple:
    d = y.astype(np.float64) - x
    var = float(x.astype(np.float64).var())
    return float((d**2).mean() / var), float(np.abs(d).max() / np.sqrt(var))


def int8_rows(n: int = 1 << 20, real: bool = False) -> List[dict]:
    quantizers: Dict[str, tuple] = {
        "numpy mean+-6sd, per tensor": (lambda x: sigma_int8(x, 6.0), 8.0),
        "numpy mean+-6sd, bucket 512": (lambda x: sigma_int8(x, 6.0, 512), 8 + 64 / 512),
        "numpy mean+-6sd, bucket 4096": (lambda x: sigma_int8(x, 6.0, 4096), 8 + 64 / 4096),
        "maxmin 8 bits, bucket 512": (lambda x: maxmin(x, 8, 512), 8 + 64 / 512),
        "maxmin 8 bits, bucket 4096": (lambda x: maxmin(x, 8, 4096), 8 + 64 / 4096),
        "maxmin 8 bits, bucket 512, clip": (lambda x: maxmin(x, 8, 512, True), 8 + 64 / 512),
        "maxmin 8 bits, bucket 4096, clip": (lambda x: maxmin(x, 8, 4096, True), 8 + 64 / 4096),
    }
    rows = []
    data_sets = datasets(n)
    if real:
        data_sets["GPT-2 pseudo-gradient"] = pseudo_gradient()
    for data, x in data_sets.items():
        for name, (fn, bits) in quantizers.items():
            mse, worst = _errors(x, fn(x))
            rows.append({"data": data, "quantizer": name, "mse": mse, "max": worst, "bits": bits})
    return rows


# --- sparseloco's kept values -----------------------------------------------------------------


def kept_values(x: np.ndarray, chunk: int = 4096, ratio: float = 0.03) -> List[np.ndarray]:
    """Each chunk's top-k values (ties to the lower index), in index order."""
    k = max(1, int(np.ceil(ratio * chunk - 1e-6)))
    out = []
    for lo in range(0, len(x), chunk):
        v = x[lo : lo + chunk]
        idx = np.sort(np.argsort(-np.abs(v), kind="stable")[: min(k, len(v))])
        out.append(v[idx].astype(np.float64))
    return out


def grid_max(v: np.ndarray, b: int) -> np.ndarray:
    s, levels = np.abs(v).max(), 2**b - 1
    return -s + np.round((v + s) / (2 * s) * levels) * 2 * s / levels


def sign_min_max(v: np.ndarray, b: int) -> np.ndarray:  # sparseloco's rule
    a = np.abs(v)
    if b == 1:
        return np.sign(v) * a.mean()
    lo, hi, levels = a.min(), a.max(), 2 ** (b - 1) - 1
    d = (hi - lo) / levels
    q = np.zeros_like(a) if d == 0 else np.clip(np.floor((a - lo) / d + 0.5), 0, levels)
    return np.sign(v) * (lo + q * d)


def sign_l_max(v: np.ndarray, b: int) -> np.ndarray:
    a, levels = np.abs(v), 2 ** (b - 1)
    s = a.max()
    return np.sign(v) * np.clip(np.round(a / s * levels), 1, levels) * s / levels


def sign_mean(v: np.ndarray, b: int) -> np.ndarray:
    a = np.abs(v)
    lo, m, levels = a.min(), a.mean(), 2 ** (b - 1) - 1
    if b == 1:
        return np.sign(v) * m
    hi = min(a.max(), lo + 2 * (m - lo))
    q = np.clip(np.round((a - lo) / (hi - lo) * levels), 0, levels)
    return np.sign(v) * (lo + q * (hi - lo) / levels)


def sign_lloyd(v: np.ndarray, b: int, iters: int = 20) -> np.ndarray:
    a = np.abs(v)
    levels = 2 ** (b - 1)
    c = np.quantile(a, (np.arange(levels) + 0.5) / levels)
    for _ in range(iters):
        idx = np.argmin(np.abs(a[:, None] - c[None]), 1)
        c = np.array([a[idx == j].mean() if (idx == j).any() else c[j] for j in range(levels)])
    return np.sign(v) * c[np.argmin(np.abs(a[:, None] - c[None]), 1)]


RULES: Dict[str, Callable] = {
    "grid +-max": grid_max,
    "sign + [min,max] (chosen)": sign_min_max,
    "sign + l*max/L": sign_l_max,
    "sign + mean-based": sign_mean,
    "sign + Lloyd-Max": sign_lloyd,
}


def compressor_error(x: np.ndarray, bits: int) -> Optional[float]:
    """The registered sparseloco's squared error relative to the energy (None: not built)."""
    import torch

    from torch_cgx import compressors

    if "sparseloco" not in compressors.names():
        return None
    c = compressors.get("sparseloco", bits=bits)
    t = torch.from_numpy(x)
    y = c.decode(c.encode(t)).numpy().astype(np.float64)
    return float(((y - x) ** 2).sum() / (x.astype(np.float64) ** 2).sum())


def kept_rows(n: int = 1 << 20) -> List[dict]:
    rows = []
    for data, x in datasets(n).items():
        kept = kept_values(x)
        energy = float((x.astype(np.float64) ** 2).sum())
        dropped = energy - sum(float((v**2).sum()) for v in kept)
        for b in (1, 2, 3, 4, 8):
            row = {"data": data, "bits": b, "dropped": dropped / energy}
            for name, rule in RULES.items():
                if name == "grid +-max" and b == 1:
                    row[name] = None
                    continue
                row[name] = sum(float(((rule(v, b) - v) ** 2).sum()) for v in kept) / energy
            row["compressor total"] = compressor_error(x, b)
            rows.append(row)
    return rows


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.5f}"


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.diloco_wire", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("what", choices=("int8", "kept"))
    p.add_argument("--n", type=int, default=1 << 20, help="values per data set")
    p.add_argument(
        "--pseudo-gradient",
        action="store_true",
        help="int8: also a real pseudo-gradient (the tiny GPT-2, 30 AdamW steps)",
    )
    args = p.parse_args(argv)
    if args.what == "int8":
        print("| data | quantizer | MSE / var | max error / sd | bits per value |")
        print("|---|---|---:|---:|---:|")
        for r in int8_rows(args.n, args.pseudo_gradient):
            print(f"| {r['data']} | {r['quantizer']} | {r['mse']:.3g} | {r['max']:.3g} | "
                  f"{r['bits']:.3f} |")  # fmt: skip
        return 0
    names = list(RULES) + ["compressor total"]
    print("| data | bits | top-k drops | " + " | ".join(names) + " |")
    print("|---|---:|---:|" + "---:|" * len(names))
    for r in kept_rows(args.n):
        cells = " | ".join(_fmt(r[k]) for k in names)
        print(f"| {r['data']} | {r['bits']} | {r['dropped']:.4f} | {cells} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
