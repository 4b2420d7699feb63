"""DDP communication hooks: torch's names and signatures (``hook(state, bucket) ->
Future[Tensor]``) on any group, CGX's layer-wise hook and the hook for any registered compressor.

``model.register_comm_hook(state, hook)``:

=========================  ===================================================================
``allreduce_hook``         state: a group (None: default); the group's own allreduce, averaged
``fp16_compress_hook``     state: a group; averaged in float16, cast back
``bf16_compress_hook``     state: a group; averaged in bfloat16, cast back
``fp16_compress_wrapper``  ``fp16_compress_wrapper(hook)``: any hook on a float16 copy
``bf16_compress_wrapper``  ``bf16_compress_wrapper(hook)``: any hook on a bfloat16 copy
``noop_hook``              no communication (each rank keeps its own gradients)
``powerSGD_hook``          state: :class:`PowerSGDState`; torch's PowerSGD, two allreduces a step
``batched_powerSGD_hook``  state: :class:`PowerSGDState`; one square matrix per bucket
``cgx_hook``               state: :class:`CGXState`; CGX's layer-wise max-min (cgx group)
``compression_hook``       state: :class:`CompressionState`; any compressor, error feedback
=========================  ===================================================================

``cgx_hook``, ``compression_hook`` and ``torch_cgx.compression.ddp.policy_hook`` are presets over
one core (``core.py``: staging, the native call with residuals, unstaging; native options built
once per version of the group's settings); docs/hooks.md tables their defaults.
"""

from torch_cgx.hooks.cgx import CGXState, cgx_hook
from torch_cgx.hooks.compression import CompressionState, compression_hook
from torch_cgx.hooks.default import (
    allreduce_hook,
    bf16_compress_hook,
    bf16_compress_wrapper,
    fp16_compress_hook,
    fp16_compress_wrapper,
    noop_hook,
)
from torch_cgx.hooks.powersgd import PowerSGDState, batched_powerSGD_hook, powerSGD_hook

__all__ = [
    "CGXState",
    "CompressionState",
    "PowerSGDState",
    "allreduce_hook",
    "batched_powerSGD_hook",
    "bf16_compress_hook",
    "bf16_compress_wrapper",
    "cgx_hook",
    "compression_hook",
    "fp16_compress_hook",
    "fp16_compress_wrapper",
    "noop_hook",
    "powerSGD_hook",
]
