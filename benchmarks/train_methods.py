"""Methods of the training benchmark (benchmarks/train.py): how DDP reduces the gradients.

gloo            DDP's built-in allreduce over a Gloo group (uncompressed)
fp16            torch's fp16_compress_hook over the Gloo group
bf16            torch_cgx.hooks.bf16_compress_hook over the Gloo group (DDP refuses torch's on CPU)
powersgd        torch's powerSGD_hook (PowerSGDState) over the Gloo group, buckets serialized
cgx-powersgd    torch_cgx.hooks.powerSGD_hook over the Gloo group (same parameters and math)
cgx-batched-powersgd
                torch_cgx.hooks.batched_powerSGD_hook over the Gloo group
cgx-powersgd-q8 torch_cgx.hooks.powerSGD_hook on the cgx group, P and Q sent as 8-bit max-min
policy8         torch_cgx.compression's SizeAdaptiveCompression(65536, NoCompression(),
                Uniform8BitQuantization()) as the DDP policy on the cgx group (hivemind's names)
cgxN            torch_cgx's cgx_hook on the cgx group, N bits (1..8), the default levers
cgxN:legacy     CGX's own hook (layers concatenated, no error feedback, no rotation)
cgxN:+L / :-L   a lever on / off (L: layer, ef, sr, rot, mean, clip), e.g. cgx4:legacy:+ef
cgx-adaptiveX   cgx_hook with adaptive bits per layer, an average of X code bits per value
                (levers as for cgxN: cgx-adaptive3:-clip)
ddp-cgxN        no hook: DDP's own allreduce per bucket on the cgx group at N bits, the group's
                defaults (CGX_* variables alone: rotation at 1-4 bits); ddp-cgxN:norot without
c:<name>        torch_cgx's compression_hook with CompressionState(compressor=<name>), default
                parameters, error feedback and momentum as the hook defaults them
c:<name>:ef     the same with error feedback forced on (:noef: forced off)
all-compressors c:<name> for every registered compressor (torch_cgx.compressors.names())
all-noef        c:<name>:noef for every compressor whose default keeps error feedback
noop            torch's noop_hook: no communication at all
"""

from __future__ import annotations

import argparse
from typing import List, Optional

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.distributed.algorithms.ddp_comm_hooks.debugging_hooks import noop_hook
from torch.nn.parallel import DistributedDataParallel as DDP

import torch_cgx
from torch_cgx import compressors
from torch_cgx import hooks as cgx_hooks

METHODS = ("gloo", "fp16", "bf16", "powersgd", "cgx-powersgd", "cgx8", "cgx4", "cgx2", "noop")
EXTRA_METHODS = ("cgx-batched-powersgd", "cgx-powersgd-q8", "policy8", "cgx-auto")  # opt-in
_OUR_PSGD = {
    "cgx-powersgd": {},
    "cgx-batched-powersgd": {},
    "cgx-powersgd-q8": {"quantize_bits": 8},
}
ALL_COMPRESSORS = "all-compressors"
ALL_NOEF = "all-noef"
_EF_SUFFIX = {"": None, ":ef": True, ":noef": False}


def cgx_bits(method: str) -> Optional[int]:
    if method.startswith("cgx") and method[3:].isdigit() and 1 <= int(method[3:]) <= 8:
        return int(method[3:])
    return None


_LEVER_FLAGS = {"layer": "split_layers", "ef": "error_feedback", "sr": "stochastic",
                "rot": "rotation", "mean": "mean_levels", "clip": "clip"}  # fmt: skip


def backend_variant(method: str) -> Optional[tuple]:
    """``ddp-cgxN[:norot]`` -> (N, rotation setting), else None."""
    base, _, suffix = method.partition(":")
    if not base.startswith("ddp-") or cgx_bits(base[4:]) is None or suffix not in ("", "norot"):
        return None
    return cgx_bits(base[4:]), "off" if suffix else "auto"


def cgx_variant(method: str) -> Optional[tuple]:
    """``cgxN[:legacy][:+L|:-L...]`` or ``cgx-adaptiveX[:+L|:-L...]`` -> (bits, CGXState
    keyword arguments); None for the other methods."""
    head, _, tail = method.partition(":")
    if head.startswith("cgx-adaptive"):
        try:
            budget = float(head[len("cgx-adaptive") :])
        except ValueError:
            return None
        if not 1 <= budget <= 8:
            return None
        bits, kwargs = max(1, int(budget)), {"adaptive_bits": budget}
    else:
        bits, kwargs = cgx_bits(head), {}
    if bits is None:
        return None
    for part in tail.split(":") if tail else []:
        if part == "legacy" and "adaptive_bits" not in kwargs:
            kwargs["legacy"] = True
        elif part[:1] in ("+", "-") and part[1:] in _LEVER_FLAGS:
            kwargs[_LEVER_FLAGS[part[1:]]] = part[0] == "+"
        else:
            return None
    return bits, kwargs


def _split_compressor(method: str):
    """``c:<name>[:ef|:noef]`` -> (name, error feedback: None = the hook's default) or None."""
    if not method.startswith("c:"):
        return None
    name, _, ef = method[2:].partition(":")
    suffix = ":" + ef if ef else ""
    if name not in compressors.names() or suffix not in _EF_SUFFIX:
        return None
    return name, _EF_SUFFIX[suffix]


def compressor_of(method: str) -> Optional[str]:
    """``c:<name>[:ef|:noef]`` -> name (a registered compressor); None for the other methods."""
    split = _split_compressor(method)
    return None if split is None else split[0]


def error_feedback_of(method: str) -> Optional[bool]:
    """``:ef`` -> True, ``:noef`` -> False, otherwise None (the hook's default)."""
    split = _split_compressor(method)
    return None if split is None else split[1]


def _default_ef_compressors() -> List[str]:
    return [n for n in compressors.names() if torch_cgx.CompressionState.default_error_feedback(n)]


def on_cgx_group(method: str) -> bool:
    """Reduced by the cgx backend (whose byte counter then measures the wire)."""
    return (
        cgx_variant(method) is not None
        or compressor_of(method) is not None
        or backend_variant(method) is not None
        or method in ("cgx-powersgd-q8", "policy8", "cgx-auto")
    )


def parse_methods(text: str) -> List[str]:
    methods = []
    for m in (m.strip() for m in text.split(",")):
        if m == ALL_COMPRESSORS:
            methods += [f"c:{name}" for name in compressors.names()]
        elif m == ALL_NOEF:
            methods += [f"c:{name}:noef" for name in _default_ef_compressors()]
        elif m:
            methods.append(m)
    for m in methods:
        if m not in METHODS + EXTRA_METHODS and not on_cgx_group(m):
            raise argparse.ArgumentTypeError(
                f"unknown method {m!r} (choose from {', '.join(METHODS + EXTRA_METHODS)}, "
                "cgx1..cgx8[:legacy][:+L|:-L] (L: layer, ef, sr, rot, mean, clip), cgx-adaptiveX, "
                "ddp-cgx1..ddp-cgx8[:norot], "
                f"c:<compressor>[:ef|:noef] with one of {', '.join(compressors.names())}, "
                f"{ALL_COMPRESSORS} or {ALL_NOEF})"
            )
    if len(set(methods)) != len(methods) or not methods:
        raise argparse.ArgumentTypeError(f"methods must be distinct and non-empty: {text!r}")
    return methods


class SerialHook:
    """Runs a comm hook on one DDP bucket after another: bucket i starts once bucket i - 1 is
    reduced.

    powerSGD_hook issues its second and third allreduces from the callbacks of the first; with
    several buckets, Gloo's completion threads then issue the collectives of different buckets
    in a different order on each rank (a size mismatch, or a silently wrong sum). Chaining the
    buckets keeps the hook unchanged and backward still overlaps with the reductions.
    """

    def __init__(self, state, hook) -> None:
        self.state, self.hook, self.prev = state, hook, None

    def __call__(self, bucket: dist.GradBucket) -> torch.futures.Future:
        out = torch.futures.Future()

        def finish(inner: torch.futures.Future) -> None:
            try:
                out.set_result(inner.value())
            except Exception as e:  # handed to DDP's wait
                out.set_exception(e)

        def start(_=None) -> None:
            try:
                self.hook(self.state, bucket).add_done_callback(finish)
            except Exception as e:
                out.set_exception(e)

        prev, self.prev = self.prev, out
        if prev is None:
            start()
        else:
            prev.add_done_callback(start)  # runs at once when prev is already done
        return out


def serial_hook(state, bucket):  # no annotations: DDP checks them and this module's are strings
    return state(bucket)


def _compression_state(model: torch.nn.Module, method: str, args):
    return torch_cgx.CompressionState(
        dist.group.WORLD,
        compressor=compressor_of(method),
        error_feedback=error_feedback_of(method),
        layer_min_size=args.layer_min_size,
        module=model,
    )


def _psgd_args(args) -> dict:
    return {
        "matrix_approximation_rank": args.powersgd_rank,
        "start_powerSGD_iter": args.powersgd_start_iter,
        "random_seed": args.seed,
    }


def wrap(model: torch.nn.Module, method: str, gloo, args) -> tuple:
    """(DDP model, hook state: PowerSGDState, CompressionState or None) for the method."""
    common = {"bucket_cap_mb": args.bucket_cap_mb}  # the models have no buffers
    if method in _OUR_PSGD:
        group = dist.group.WORLD if on_cgx_group(method) else gloo
        ddp = DDP(model, process_group=group, **common)
        state = cgx_hooks.PowerSGDState(group, module=model, **_psgd_args(args),
                                        **_OUR_PSGD[method])  # fmt: skip
        batched = method == "cgx-batched-powersgd"
        ddp.register_comm_hook(
            state, cgx_hooks.batched_powerSGD_hook if batched else cgx_hooks.powerSGD_hook
        )
        return ddp, state
    if method == "cgx-auto":  # no hook: DDP's own allreduce per bucket, planned by the group
        torch_cgx.set_config(compressor="auto", bits=4)  # the planner's budget: >= 4 bits
        return DDP(model, process_group=dist.group.WORLD, **common), None
    if backend_variant(method) is not None:  # no hook: the backend compresses DDP's buckets
        bits, rotation = backend_variant(method)
        torch_cgx.set_config(compressor="maxmin", compressor_params={}, bits=bits,
                             bucket_size=args.bucket_size, rotation=rotation)  # fmt: skip
        return DDP(model, process_group=dist.group.WORLD, **common), None
    if method == "policy8":
        from torch_cgx import compression as C

        ddp = DDP(model, process_group=dist.group.WORLD, **common)
        policy = C.SizeAdaptiveCompression(65536, C.NoCompression(), C.Uniform8BitQuantization())
        return ddp, C.register_policy(ddp, policy)
    variant, name = cgx_variant(method), compressor_of(method)
    if variant is not None or name is not None:
        ddp = DDP(model, process_group=dist.group.WORLD, **common)  # the cgx group
        if name is not None:
            state = _compression_state(model, method, args)
            ddp.register_comm_hook(state, torch_cgx.compression_hook)
            return ddp, state
        bits, kwargs = variant
        params = {"bits": bits, "bucket_size": args.bucket_size}
        state = torch_cgx.CGXState(dist.group.WORLD, args.layer_min_size, params, module=model,
                                   **kwargs)  # fmt: skip
        ddp.register_comm_hook(state, torch_cgx.cgx_hook)
        return ddp, state
    ddp = DDP(model, process_group=gloo, **common)
    if method == "fp16":
        ddp.register_comm_hook(gloo, default_hooks.fp16_compress_hook)
    elif method == "bf16":
        ddp.register_comm_hook(gloo, cgx_hooks.bf16_compress_hook)
    elif method == "powersgd":
        state = powerSGD_hook.PowerSGDState(process_group=gloo, **_psgd_args(args))
        ddp.register_comm_hook(SerialHook(state, powerSGD_hook.powerSGD_hook), serial_hook)
        return ddp, state
    elif method == "noop":
        ddp.register_comm_hook(None, noop_hook)
    return ddp, None


def nominal_bits(method: str) -> Optional[int]:
    """Bits per value of the method's record: N for cgxN, 16 for fp16, None for c:<name> (its
    payload says: wire bytes), 32 for the rest."""
    if compressor_of(method) is not None or method in ("policy8", "cgx-auto"):
        return None
    if backend_variant(method) is not None:
        return backend_variant(method)[0]
    variant = cgx_variant(method)
    if variant is not None and "adaptive_bits" in variant[1]:
        return variant[1]["adaptive_bits"]
    bits = None if variant is None else variant[0]
    return bits if bits is not None else (16 if method in ("fp16", "bf16") else 32)


def method_info(state) -> dict:
    """The record fields of a c:<name> method's CompressionState (empty for the others)."""
    if not isinstance(state, torch_cgx.CompressionState):
        return {}
    return {
        "compressor": state.compressor,
        "compressor_params": dict(state.params),
        "error_feedback": state.error_feedback,
        "hook_momentum": state.momentum,
    }


class WireMeter:
    """Bytes one rank sends per step after the warm-up: the cgx group's counters (the native
    engine's and the device plane's: ``torch_cgx.stats``) for methods on the cgx group; for
    Gloo-based ones a ring's 2 (W - 1) / W times the reduced bytes."""

    def __init__(self, method: str, state, grad_bytes: int, world: int, args) -> None:
        self.method, self.state, self.grad_bytes, self.args = method, state, grad_bytes, args
        self.ring = 2 * (world - 1) / world
        self.counter = on_cgx_group(method)
        psgd_states = (powerSGD_hook.PowerSGDState, cgx_hooks.PowerSGDState)
        self.psgd = state if isinstance(state, psgd_states) else None
        self.bytes0 = self.numel0 = 0

    def start(self) -> None:
        """Called at the first timed step."""
        if self.counter:
            self.bytes0 = torch_cgx.stats().bytes_sent
        if self.psgd is not None:
            self.numel0 = self.psgd.total_numel_after_compression

    def per_step(self, steps: int, warmup: int) -> float:
        timed = steps - warmup
        if self.counter:
            return (torch_cgx.stats().bytes_sent - self.bytes0) / timed
        if self.method == "noop":
            return 0.0
        if self.method in ("fp16", "bf16"):
            return self.ring * self.grad_bytes / 2
        if self.psgd is not None:
            # PowerSGDState counts the elements reduced once compression has started; steps
            # before start_powerSGD_iter reduce every gradient uncompressed.
            plain = max(0, min(self.args.powersgd_start_iter, steps) - warmup)
            numel = self.psgd.total_numel_after_compression - self.numel0
            return self.ring * (4 * numel + plain * self.grad_bytes) / timed
        return self.ring * self.grad_bytes
