"""PyTorch's default DDP hooks under their names and signatures, on any group (Gloo, NCCL, cgx).

``allreduce_hook`` averages with the group's own allreduce (a cgx group compresses as its
settings say, as DDP without a hook does). The fp16 / bf16 hooks cast the bucket, divide by the
world size, sum exactly (on a cgx group through its exact path: the cast is the compression) and
cast back, the arithmetic of torch's hooks step for step, so the results are bit-identical to
theirs (tests/test_default_hooks.py). The wrappers run any hook, e.g. :func:`cgx_hook`, on a
half-precision copy of the bucket.
"""

# No `from __future__ import annotations`: DDP checks the hooks' annotations at run time.
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from torch_cgx.hooks._reduce import done, exact_allreduce, group_or_default, then_value

__all__ = [
    "allreduce_hook",
    "bf16_compress_hook",
    "bf16_compress_wrapper",
    "fp16_compress_hook",
    "fp16_compress_wrapper",
    "noop_hook",
]


def allreduce_hook(
    process_group: Optional[dist.ProcessGroup], bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """Averages the bucket with the group's allreduce (what DDP does without a hook)."""
    group = group_or_default(process_group)
    buf = bucket.buffer().div_(group.size())
    work = dist.all_reduce(buf, group=group, async_op=True)
    return then_value(work.get_future(), buf)


def _cast_hook(dtype: torch.dtype, process_group, bucket) -> torch.futures.Future[torch.Tensor]:
    group = group_or_default(process_group)
    buf = bucket.buffer()
    cast = buf.to(dtype).div_(group.size())

    def back(fut: torch.futures.Future) -> torch.Tensor:
        buf.copy_(fut.value())
        return buf

    return exact_allreduce(group, cast).then(back)


def fp16_compress_hook(
    process_group: Optional[dist.ProcessGroup], bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """Averages the bucket in float16 (half the bytes), then casts it back."""
    return _cast_hook(torch.float16, process_group, bucket)


def bf16_compress_hook(
    process_group: Optional[dist.ProcessGroup], bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """Averages the bucket in bfloat16 (half the bytes, fp32's range), then casts it back."""
    return _cast_hook(torch.bfloat16, process_group, bucket)


def _cast_wrapper(dtype: torch.dtype, hook: Callable) -> Callable:
    def wrapped(hook_state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        buf = bucket.buffer()
        bucket.set_buffer(buf.to(dtype))
        fut = hook(hook_state, bucket)

        def back(f: torch.futures.Future) -> torch.Tensor:
            buf.copy_(f.value())
            return buf

        return fut.then(back)

    wrapped.__name__ = f"{torch.finfo(dtype).dtype}_compress_wrapper_{hook.__name__}"
    return wrapped


def fp16_compress_wrapper(hook: Callable) -> Callable:
    """``hook`` run on a float16 copy of the bucket; the result is cast back."""
    return _cast_wrapper(torch.float16, hook)


# DDP refuses hooks *named* bf16_compress_hook / bf16_compress_wrapper_hook unless CUDA and NCCL
# >= 2.10 are present (torch's check is by name); these run on any group, so they carry others.
bf16_compress_hook.__name__ = bf16_compress_hook.__qualname__ = "cgx_bf16_compress_hook"


def bf16_compress_wrapper(hook: Callable) -> Callable:
    """``hook`` run on a bfloat16 copy of the bucket; the result is cast back."""
    return _cast_wrapper(torch.bfloat16, hook)


def noop_hook(_: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """No communication: each rank keeps its own gradients (to measure the rest of a step)."""
    return done(bucket.buffer())
