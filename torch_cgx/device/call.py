"""One call's settings on the device plane (:class:`DeviceCall`, re-exported by
:mod:`torch_cgx.device.engine`) and how the engine resolves them into a device codec and the
traits the algorithms read (:func:`resolve`)."""

from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

from torch_cgx import settings
from torch_cgx.device.algorithms import common
from torch_cgx.device.rotation import valid_block

__all__ = ["ALGORITHMS", "DeviceCall", "resolve"]

ALGORITHMS = tuple(settings.ALGORITHMS)


@dataclasses.dataclass(frozen=True)
class DeviceCall:
    """One call's settings, built once per version of the group's settings. ``params``: the
    compressor's parameters as sorted (name, value) pairs (max-min: bits, bucket_size,
    skip_incomplete_buckets, stochastic and the clip rule's result, as the native
    ``compressor_params_of``). ``min_size``: smaller tensors are reduced exactly (at least
    ``settings.MIN_SIZE_FLOOR``, the native ``eligible``). The defaults are the table's."""

    compressor: str
    params: Tuple[Tuple[str, float], ...]
    algorithm: str = "sra"
    average: bool = False
    min_size: int = settings.MIN_SIZE_FLOOR
    seed: int = 0
    rotation: bool = False
    fusion_bytes: int = settings.native_default("fusion_buffer_mb")
    segment_bytes: int = settings.native_default("pipeline_segment_mb")
    pipeline_sparse: bool = False

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {self.algorithm!r}")
        if self.fusion_bytes < 4 or self.segment_bytes < 0:
            raise ValueError("fusion_bytes must be >= 4 and segment_bytes >= 0")
        if self.rotation and not valid_block(int(self.param("bucket_size", 0))):
            raise ValueError(
                f"rotation needs a bucket_size that is {settings.ROTATION_BLOCKS_TEXT}"
            )

    def param(self, name: str, default=None):
        return dict(self.params).get(name, default)

    @staticmethod
    def from_config(config, average: bool) -> Optional[DeviceCall]:
        """The call ``config`` (a :class:`torch_cgx.CGXConfig`) makes, or None when it reduces
        exactly (max-min at 32 bits; compressor ``auto``, whose plan decides per call)."""
        from torch_cgx import _C
        from torch_cgx.config import _parse_params

        name = config.compressor
        codec = name == "maxmin"
        if name == "auto" or (codec and not settings.quantizes(config.bits)):
            return None
        rotates = bool(_C.rotation_rule(config.rotation, config.bits, config.bucket_size, name))
        if codec:
            params = {
                "bits": config.bits,
                "bucket_size": config.bucket_size,
                "skip_incomplete_buckets": int(config.skip_incomplete_buckets),
                "stochastic": int(config.stochastic),
                "clip": int(bool(_C.clip_rule(config.clip, rotates))),
            }
        else:
            params = _parse_params("compressor_params", config.compressor_params)
        return DeviceCall(
            compressor=name,
            params=tuple(sorted((k, float(v)) for k, v in params.items())),
            algorithm=config.algorithm,
            average=bool(average),
            min_size=max(int(config.min_size), settings.MIN_SIZE_FLOOR),
            seed=int(config.seed),
            rotation=rotates,
            fusion_bytes=int(config.fusion_buffer_mb) << 20,
            segment_bytes=int(config.pipeline_segment_mb) << 20,
        )


def resolve(call: DeviceCall, make_codec) -> common.Plan:
    """The device codec of ``call`` and the traits the algorithms read (payload.h)."""
    from torch_cgx import compressors as native

    params = dict(call.params)
    specs = native.params(call.compressor)
    ints = {s["name"] for s in specs if s.get("integer")}
    typed = {k: int(v) if k in ints else v for k, v in params.items()}
    codec = make_codec(call.compressor, **typed)
    traits = native.get(call.compressor, **typed).traits
    alignment = getattr(codec, "alignment", None)
    if alignment is None:
        # a compressor with a bucket_size aligns chunks to it: the codec's own, its default
        # where the call's parameters leave it out, as the native one (payload.cc chunk_alignment)
        bucket = getattr(codec, "bucket_size", params.get("bucket_size", 0))
        bucket = int(bucket or 0) if any(s["name"] == "bucket_size" for s in specs) else 0
        alignment = bucket if bucket > 0 else 1
    return common.Plan(
        codec,
        int(alignment),
        bool(traits["fixed_size"]),
        bool(traits["sparse"]),
        bool(traits["summable"]),
    )
