"""Checkpoints of :class:`torch_cgx.diloco.DiLoCo`: what ``state_dict()`` holds and how
``load_state_dict()`` checks it.

The saved form holds only numbers, strings, lists, dicts and tensors (``torch.load`` with
``weights_only=True`` reads it): the inner-step count, the schedule, the compressor, and per
fragment the global copies, the outer optimizer's state, the residuals (error feedback), the
count of its syncs and, when a reduction was in flight, its result (``state_dict`` waits for
it), so that a resume continues bit for bit. The model's parameters and the inner optimizer
are the caller's to save (``model.state_dict()``, ``inner_optimizer.state_dict()``); load
them after constructing the DiLoCo (its constructor broadcasts rank 0's parameters).
"""

from __future__ import annotations

import copy
from typing import Dict

import torch

__all__ = ["VERSION", "load", "save"]

VERSION = 1


def save(diloco) -> Dict:
    """The state of ``diloco`` (waits for a reduction in flight; it stays to be applied)."""
    fragments = []
    for frag in diloco._fragments:
        pending = None
        result = frag.pending.wait() if frag.pending is not None else None
        if result is not None:  # (None: a managed reduction that failed; discarded at its step)
            pending = result.detach().clone()
            frag.take_residuals()
        fragments.append(
            {
                "globals": {n: g.detach().clone() for n, g in zip(frag.names, frag.globals)},
                "outer_optimizer": copy.deepcopy(frag.optimizer.state_dict()),
                "residuals": {n: r.detach().clone() for n, r in frag.residuals.items()},
                "syncs": frag.syncs,
                "pending": pending,
            }
        )
    return {
        "version": VERSION,
        "step": diloco.step,
        "schedule": diloco.schedule.as_dict(),
        "compressor": diloco.spec.name,
        "compressor_params": dict(diloco.spec.params),
        "error_feedback": diloco.error_feedback,
        "fragments": fragments,
    }


def _same(saved, mine, what: str) -> None:
    if saved != mine:
        raise ValueError(f"the checkpoint's {what} is {saved!r}, this DiLoCo's {mine!r}")


def load(diloco, state: Dict) -> None:
    """Restores ``state`` (from :func:`save`) into ``diloco``; ValueError where it does not fit
    (another schedule, compressor, fragment layout or parameter shapes), before changing
    anything."""
    from torch_cgx.diloco.reduce import Pending

    if not isinstance(state, dict) or state.get("version") != VERSION:
        raise ValueError(f"state must be a DiLoCo.state_dict() of version {VERSION}")
    diloco.schedule.check(state["schedule"])
    _same(state["compressor"], diloco.spec.name, "compressor")
    _same(state["compressor_params"], diloco.spec.params, "compressor_params")
    _same(state["error_feedback"], diloco.error_feedback, "error_feedback")
    saved = state["fragments"]
    _same(len(saved), len(diloco._fragments), "number of fragments")
    for i, (frag, s) in enumerate(zip(diloco._fragments, saved)):
        _same(sorted(s["globals"]), sorted(frag.names), f"fragment {i}'s parameter names")
        for name, g in zip(frag.names, frag.globals):
            _same(tuple(s["globals"][name].shape), tuple(g.shape), f"shape of {name}")
        if s["pending"] is not None:
            _same(s["pending"].numel(), frag.numel, f"fragment {i}'s pending size")
    diloco.step = int(state["step"])
    for frag, s in zip(diloco._fragments, saved):
        with torch.no_grad():
            for name, g in zip(frag.names, frag.globals):
                g.copy_(s["globals"][name])
        frag.optimizer.load_state_dict(s["outer_optimizer"])
        frag.residuals = {n: r.to(frag.device).clone() for n, r in s["residuals"].items()}
        frag.syncs = int(s["syncs"])
        frag.pending = None if s["pending"] is None else Pending.done(s["pending"].to(frag.device))
        frag.new_residual = None
