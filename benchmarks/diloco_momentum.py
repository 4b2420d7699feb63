"""One replica of DiLoCo on the torchft tests' regression model (tests/torchft_replica.py), by
hand: the held-out loss every few windows for an outer momentum, with each average applied at
once (DiLoCo) or one window late (``semi_async``). Why docs/diloco-torchft.md advises a lower
outer momentum for the semi-asynchronous schedule.

    python -m benchmarks.diloco_momentum
"""

from __future__ import annotations

import argparse

import torch


def run(momentum: float, late: bool, windows: int = 40, h: int = 4, outer_lr: float = 0.7):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    target = torch.nn.Linear(16, 1)
    data = torch.Generator().manual_seed(7919)
    inner = torch.optim.SGD(model.parameters(), lr=0.05)
    glob = [p.detach().clone() for p in model.parameters()]
    outer = torch.optim.SGD(glob, lr=outer_lr, momentum=momentum, nesterov=momentum > 0)
    held_out = torch.randn(256, 16, generator=torch.Generator().manual_seed(12345))
    losses, in_flight = [], None
    for _ in range(windows):
        for _ in range(h):
            x = torch.randn(32, 16, generator=data)
            torch.nn.functional.mse_loss(model(x), target(x).detach()).backward()
            inner.step()
            inner.zero_grad()
        delta = [g - p.detach() for g, p in zip(glob, model.parameters())]
        step = in_flight if late else delta
        if step is not None:
            for g, d in zip(glob, step):
                g.grad = d
            outer.step()
        in_flight = delta
        with torch.no_grad():
            for g, p in zip(glob, model.parameters()):
                p.copy_(g)
            losses.append(float(torch.nn.functional.mse_loss(model(held_out), target(held_out))))
    return losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--windows", type=int, default=40)
    args = parser.parse_args()
    for late in (False, True):
        for momentum in (0.9, 0.5, 0.0):
            losses = run(momentum, late, args.windows)
            shown = " ".join(f"{v:.3f}" for v in losses[:: max(1, len(losses) // 10)])
            name = "semi_async" if late else "DiLoCo    "
            print(f"{name} momentum {momentum}: held-out loss {shown} -> {losses[-1]:.4f}")


if __name__ == "__main__":
    main()
