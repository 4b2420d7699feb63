"""Error against bits per value of the float formats beside max-min, on three inputs.

``python -m benchmarks.float_formats [--n 1048576] [--seed 0]``

Inputs: ``gradient`` (one gradient of a 2-layer MLP on random data, its parameters flattened),
``pseudo-gradient`` (the change of the same MLP's parameters over 20 AdamW steps: what DiLoCo
averages) and ``heavy-tailed`` (Student's t with 2 degrees of freedom). For each compressor: bits
per value (its payload bytes * 8 / n, headers included) and the relative error |x' - x| / |x| of
one round trip, nearest and (where the compressor has it) stochastic rounding.
"""

from __future__ import annotations

import argparse
from typing import Dict, List, Optional

import torch

from torch_cgx import compressors

ROWS = [
    ("maxmin", {"bits": 4}),
    ("maxmin", {"bits": 8}),
    ("mxfp4", {}),
    ("nvfp4", {}),
    ("mxfp6", {}),
    ("mxfp6", {"element": 1}),
    ("mxfp8", {}),
    ("mxfp8", {"element": 1}),
    ("fp8", {}),
    ("fp8", {"block": 128}),
]


def _mlp(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(),
                               torch.nn.Linear(1024, 256))  # fmt: skip


def _flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def inputs(n: int, seed: int) -> Dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    model = _mlp(seed)
    x, y = torch.randn(64, 256, generator=g), torch.randn(64, 256, generator=g)
    torch.nn.functional.mse_loss(model(x), y).backward()
    grad = _flat(p.grad for p in model.parameters())
    before = _flat(model.parameters()).clone()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(20):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    pseudo = before - _flat(model.parameters())
    heavy = torch.distributions.StudentT(2.0).sample((n,))
    return {"gradient": grad[:n], "pseudo-gradient": pseudo[:n], "heavy-tailed": heavy}


def measure(name: str, params: dict, x: torch.Tensor) -> dict:
    c = compressors.get(name, **params)
    p = c.encode(x, seed=1, stream=1)
    out = {"bits": 8 * p.numel() / x.numel(), "nearest": _err(c.decode(p), x)}
    if any(s["name"] == "stochastic" for s in compressors.params(name)):
        s = compressors.get(name, **{**params, "stochastic": 1})
        out["stochastic"] = _err(s.decode(s.encode(x, seed=1, stream=1)), x)
    return out


def _err(y: torch.Tensor, x: torch.Tensor) -> float:
    return float((y.double() - x.double()).norm() / x.double().norm())


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=1 << 20, help="values of the heavy-tailed input")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    data = inputs(args.n, args.seed)
    print("relative error |x' - x| / |x| of one round trip (nearest / stochastic rounding)")
    print(f"{'compressor':<22} {'bits':>6} " + " ".join(f"{k:>22}" for k in data))
    for name, params in ROWS:
        label = name + "".join(f" {k}={v}" for k, v in params.items())
        cells, bits = [], 0.0
        for x in data.values():
            r = measure(name, params, x)
            bits = r["bits"] if x is data["heavy-tailed"] else bits
            sto = f" / {r['stochastic']:.4f}" if "stochastic" in r else ""
            cells.append(f"{r['nearest']:.4f}{sto}")
        print(f"{label:<22} {bits:>6.2f} " + " ".join(f"{c:>22}" for c in cells))
    print(f"# values: {', '.join(f'{k} {v.numel()}' for k, v in data.items())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
