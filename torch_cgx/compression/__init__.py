"""Compression objects with hivemind's names and behaviour, on torch_cgx's codecs.

>>> from torch_cgx import compression as C
>>> policy = C.SizeAdaptiveCompression(2**16, C.Float16Compression(), C.Uniform8BitQuantization())
>>> payload = policy.compress(tensor, C.CompressionInfo.from_tensor(tensor, key="w"))
>>> C.extract(payload)                                     # or policy.extract(payload)
>>> policy.estimate_compression_ratio(info)                # compressed / original bits
>>> C.register_policy(ddp_model, policy)                   # the DDP gradient policy (cgx group)

================================  ===============================================================
``NoCompression``                 the tensor's bytes (exact, any dtype); ratio 1
``Float16Compression``            clamp to the fp16 range, fp16 codec; ratio 16 / bits
``ScaledFloat16Compression``      mean/std-normalised fp16 along the last axis; ratio 16 / bits
``Uniform8BitQuantization``       max-min 8 bits, one range per tensor; ratio 8 / bits
``BlockwiseQuantization``         max-min 8 bits per block of 4096; ratio 8 / bits
``Quantile8BitQuantization``      equal-population bins, bin means (torch ops); ratio 8 / bits
``CGXCompression(name, **p)``     any of ``torch_cgx.compressors.names()``; exact ratio
``SizeAdaptiveCompression``       ``greater_equal`` iff numel >= threshold, else ``less``
``RoleAdaptiveCompression``       per TensorRole (activation, parameter, gradient, optimizer)
``PerTensorCompression``          per key (parameter name, or index into a sequence)
================================  ===============================================================

Error bounds and formats: docs/compression.md. hivemind interop: :func:`to_hivemind`.
"""

from torch_cgx.compression.adaptive import (
    AdaptiveCompressionBase,
    PerTensorCompression,
    RoleAdaptiveCompression,
    SizeAdaptiveCompression,
    resolve,
)
from torch_cgx.compression.base import (
    CompressionBase,
    CompressionInfo,
    NoCompression,
    Payload,
    TensorDescriptor,
    TensorRole,
    extract,
)
from torch_cgx.compression.ddp import PolicyState, policy_hook, register_policy
from torch_cgx.compression.floating import Float16Compression, ScaledFloat16Compression
from torch_cgx.compression.hivemind_compat import to_hivemind
from torch_cgx.compression.quantization import (
    BlockwiseQuantization,
    Quantile8BitQuantization,
    Uniform8BitQuantization,
)
from torch_cgx.compression.registered import CGXCompression

__all__ = [
    "AdaptiveCompressionBase",
    "BlockwiseQuantization",
    "CGXCompression",
    "CompressionBase",
    "CompressionInfo",
    "Float16Compression",
    "NoCompression",
    "Payload",
    "PerTensorCompression",
    "PolicyState",
    "Quantile8BitQuantization",
    "RoleAdaptiveCompression",
    "ScaledFloat16Compression",
    "SizeAdaptiveCompression",
    "TensorDescriptor",
    "TensorRole",
    "Uniform8BitQuantization",
    "extract",
    "policy_hook",
    "register_policy",
    "resolve",
    "to_hivemind",
]
