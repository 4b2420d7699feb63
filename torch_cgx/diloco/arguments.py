"""DiLoCo's arguments: the fragments, the outer optimizers, and torchft's calling convention.

torchft's ``DiLoCo(manager, model_fragments, inner_optimizer, outer_optimizer, sync_every,
backup_device=None, pin_memory=True, use_bucketization=False, bucket_cap_mb=None,
should_quantize=False, fragment_sync_delay=0, fragment_update_alpha=0.0)`` is accepted as it is
written: :func:`torchft_order` moves a leading manager to ``manager=`` and maps torchft's
keywords (docs/diloco.md, "Unreliable peers: torchft").
"""

from __future__ import annotations

from typing import List, Sequence

import torch

__all__ = ["fragments", "is_manager", "outer_optimizers", "torchft_order"]

_TORCHFT_POSITIONAL = ("model_fragments", "inner_optimizer", "outer_optimizer", "sync_every")
_MANAGER_METHODS = ("start_quorum", "should_commit", "register_state_dict_fn", "report_error")


def is_manager(obj) -> bool:
    """Whether ``obj`` is a torchft ``Manager`` (by its methods: torchft stays optional)."""
    return all(callable(getattr(obj, m, None)) for m in _MANAGER_METHODS)


def torchft_order(args: tuple, kwargs: dict) -> dict:
    """The keyword arguments of ``DiLoCo._setup`` from a call written either way:
    ``DiLoCo(model_fragments, inner_optimizer, ...)`` or torchft's ``DiLoCo(manager,
    model_fragments, inner_optimizer, outer_optimizer, sync_every, ...)``."""
    args, kwargs = list(args), dict(kwargs)
    if args and is_manager(args[0]):
        if "manager" in kwargs:
            raise ValueError("manager given twice: as the first argument and as manager=")
        kwargs["manager"] = args.pop(0)
    if len(args) > len(_TORCHFT_POSITIONAL):
        raise TypeError(f"DiLoCo takes at most {len(_TORCHFT_POSITIONAL)} positional arguments")
    for name, value in zip(_TORCHFT_POSITIONAL, args):
        if name in kwargs:
            raise TypeError(f"DiLoCo got multiple values for argument {name!r}")
        kwargs[name] = value
    return _torchft_keywords(kwargs)


def _torchft_keywords(kwargs: dict) -> dict:
    """torchft's keywords, mapped: ``should_quantize=True`` is max-min at 8 bits (torchft
    quantizes to fp8 per row; max-min 8-bit per bucket of 512 is the nearest registered
    codec); ``use_bucketization`` / ``bucket_cap_mb`` are accepted (each fragment already
    travels as one flat buffer); ``backup_device`` / ``pin_memory`` place the global copies."""
    quantize = kwargs.pop("should_quantize", False)
    if not isinstance(quantize, bool):
        raise ValueError(f"should_quantize must be a bool, got {quantize!r}")
    if quantize:
        if "compressor" in kwargs or "compressor_params" in kwargs:
            raise ValueError(
                "should_quantize=True and compressor= both given: give one (should_quantize is "
                "compressor='maxmin', compressor_params={'bits': 8})"
            )
        kwargs["compressor"], kwargs["compressor_params"] = "maxmin", {"bits": 8}
    bucketize = kwargs.pop("use_bucketization", False)
    if not isinstance(bucketize, bool):
        raise ValueError(f"use_bucketization must be a bool, got {bucketize!r}")
    cap = kwargs.pop("bucket_cap_mb", None)
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float)) or cap <= 0):
        raise ValueError(f"bucket_cap_mb must be a positive number or None, got {cap!r}")
    return kwargs


def fragments(model_fragments) -> List[torch.nn.Module]:
    if isinstance(model_fragments, torch.nn.Module):
        model_fragments = [model_fragments]
    if not isinstance(model_fragments, (list, tuple)) or not model_fragments:
        raise ValueError("model_fragments must be a module or a non-empty list of modules")
    seen = set()
    for i, m in enumerate(model_fragments):
        if not isinstance(m, torch.nn.Module):
            raise ValueError(f"model_fragments[{i}] must be a torch.nn.Module, got {type(m)}")
        ids = [id(p) for p in m.parameters()]
        if not ids:
            raise ValueError(f"model_fragments[{i}] has no parameters")
        if seen.intersection(ids):
            raise ValueError(f"model_fragments[{i}] shares parameters with an earlier fragment")
        seen.update(ids)
    return list(model_fragments)


def _held(opt) -> set:
    return {id(p) for group in opt.param_groups for p in group["params"]}


def outer_optimizers(outer_optimizer, modules: Sequence[torch.nn.Module], default) -> list:
    """One optimizer per fragment. One optimizer over every fragment's parameters is accepted
    too (torchft's form): each outer step then steps only the syncing fragment's parameters
    (``Fragment.outer_step`` hides the others' gradients)."""
    k = len(modules)
    if outer_optimizer is None:
        return [default(m.parameters()) for m in modules]
    if callable(outer_optimizer) and not isinstance(outer_optimizer, torch.optim.Optimizer):
        made = [outer_optimizer(m.parameters()) for m in modules]
    elif isinstance(outer_optimizer, torch.optim.Optimizer):
        every = {id(p) for m in modules for p in m.parameters()}
        if _held(outer_optimizer) != every:
            which = "its fragment's" if k == 1 else "every fragment's"
            raise ValueError(f"outer_optimizer must hold exactly {which} parameters")
        return [outer_optimizer] * k
    elif isinstance(outer_optimizer, (list, tuple)) and len(outer_optimizer) == k:
        made = list(outer_optimizer)
    else:
        raise ValueError(
            f"outer_optimizer must be None, an optimizer, a list of {k} optimizers or a "
            f"factory params -> optimizer, got {outer_optimizer!r}"
        )
    for i, (opt, m) in enumerate(zip(made, modules)):
        if not isinstance(opt, torch.optim.Optimizer):
            raise ValueError(f"outer_optimizer[{i}] is not a torch.optim.Optimizer: {opt!r}")
        if _held(opt) != {id(p) for p in m.parameters()}:
            raise ValueError(
                f"outer_optimizer[{i}] must hold exactly the parameters of model_fragments[{i}]"
            )
    return made
