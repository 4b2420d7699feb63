"""Max-min (docs/FORMAT.md, "The max-min wire format") in tensor operations, with every lever.

Bits 1..8, any bucket size, the raw tail (``skip_incomplete_buckets``), stochastic rounding (the
shared generator, keyed by the element's index in the whole buffer), the clipped range (``clip``)
and fp32 / fp16 / bf16 input. The bytes are the native codec's (``torch_cgx.codec``) on CPU
tensors, nearest and stochastic alike; tests/test_device_maxmin.py checks it. On CUDA tensors the
Triton kernels (torch_cgx/device/triton/maxmin.py) may replace :meth:`MaxMin.encode` /
:meth:`MaxMin.decode_add_` after a self-check (torch_cgx/device/kernels.py).

Every step of FORMAT.md maps to whole-tensor operations: per-bucket scalars are computed for all
buckets at once on an ``(buckets, bucket_size)`` view, the element arithmetic is one fp32 (or
fp64) operation per torch op, so no rounding is fused or reordered. The fp64 path of step 4 is
evaluated for every element and selected per bucket (no host synchronisation to ask whether a
bucket needs it), so the device must have fp64 (CUDA has; MPS has not).
"""

from __future__ import annotations

from typing import Tuple

import torch

from torch_cgx.device import constants
from torch_cgx.device.codecs.base import DTYPE_CODES, DeviceCodec, uniform
from torch_cgx.device.codecs.fused import Fusable

__all__ = ["CODECS", "MaxMin", "lane_sum"]

FLT_MAX = 3.4028234663852886e38
HEADER_BYTES = 24
FLAG_RAW_TAIL, FLAG_STOCHASTIC, FLAG_CLIPPED = 1, 2, 4
# Range of the Gaussian-optimal uniform quantizer in standard deviations, bits 1..8 (FORMAT.md).
CLIP_SIGMAS = (0.0, 1.5958, 2.9872, 4.1024, 5.0278, 5.8326, 6.5559, 7.2247, 7.8412)
# Lane sums over at most this many rows run as a loop of tensor additions (sequential on every
# device); longer ones use cumsum, which is sequential on the CPU only (docs/gpu.md).
LOOP_ROWS = 128
_NAN_BITS = 0x7FC00000


def _nan32(device) -> torch.Tensor:
    """The quiet NaN 0x7fc00000 as a 0-d float32 tensor (explicit bits, not a platform NaN): an
    int32 fill on the device, no copy."""
    return torch.full((), _NAN_BITS, dtype=torch.int32, device=device).view(torch.float32)


def _div(a: torch.Tensor, b) -> torch.Tensor:
    """``a / b`` correctly rounded. Never ``tensor / python number`` (CUDA multiplies by the
    reciprocal of a host scalar divisor) nor ``number / tensor`` (torch computes
    ``reciprocal(tensor) * number``): two roundings instead of one."""
    if not isinstance(b, torch.Tensor):
        b = torch.full_like(a, b)
    return torch.div(a, b)


def lane_sum(v: torch.Tensor, loop_rows: int = LOOP_ROWS) -> torch.Tensor:
    """FORMAT.md's ``S``: per row of the fp64 ``(k, m)`` tensor ``v``, lane ``j`` (0..7) sums the
    elements ``j, j + 8, ...`` in order from +0.0, then the lanes are added, lane 0 first, to
    +0.0. The row is padded to a multiple of 8 with +0.0, which adds nothing (a sum that starts
    at +0.0 is never -0.0 under round-to-nearest)."""
    k, m = v.shape
    rows = (m + 7) // 8
    if rows * 8 != m:
        v = torch.cat([v, v.new_zeros(k, rows * 8 - m)], 1)
    lanes3 = v.view(k, rows, 8)
    if rows <= loop_rows:
        lanes = v.new_zeros(k, 8)
        for r in range(rows):
            lanes = lanes + lanes3[:, r, :]
    else:  # cumsum is a sequential loop on the CPU; a parallel scan on CUDA
        lanes = torch.cumsum(lanes3, dim=1)[:, -1, :]
    total = v.new_zeros(k)
    for j in range(8):
        total = total + lanes[:, j]
    return total


class MaxMin(Fusable, DeviceCodec):
    """Max-min with the parameters of ``torch_cgx.compressors.params("maxmin")``."""

    name = "maxmin"
    fixed_size = True

    def __init__(
        self,
        bits: int = 4,
        bucket_size: int = 512,
        skip_incomplete_buckets: int = 0,
        stochastic: int = 0,
        clip: int = 0,
        **unknown,
    ) -> None:
        if unknown:
            raise ValueError(f"maxmin has no parameter {next(iter(unknown))!r} (it takes: bits, "
                             "bucket_size, skip_incomplete_buckets, stochastic, clip)")  # fmt: skip
        checks = (
            ("bits", bits, 1, 8),
            ("bucket_size", bucket_size, 1, 2**32 - 1),
            ("skip_incomplete_buckets", skip_incomplete_buckets, 0, 1),
            ("stochastic", stochastic, 0, 1),
            ("clip", clip, 0, 1),
        )
        for what, value, lo, hi in checks:
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            if not isinstance(value, int) or not lo <= value <= hi:
                raise ValueError(f"maxmin parameter {what} must be an integer in [{lo}, {hi}], "
                                 f"got {value!r}")  # fmt: skip
        super().__init__(
            bits=int(bits),
            bucket_size=int(bucket_size),
            skip_incomplete_buckets=int(skip_incomplete_buckets),
            stochastic=int(stochastic),
            clip=int(clip),
        )
        self.bits, self.bucket_size = int(bits), int(bucket_size)
        self.raw_tail = bool(skip_incomplete_buckets)
        self.stochastic, self.clip = bool(stochastic), bool(clip)
        self.levels = (1 << self.bits) - 1
        self.flags = (
            (FLAG_RAW_TAIL if self.raw_tail else 0)
            | (FLAG_STOCHASTIC if self.stochastic else 0)
            | (FLAG_CLIPPED if self.clip else 0)
        )

    # ---- layout ---------------------------------------------------------------------------------

    def layout(self, numel: int) -> Tuple[int, int]:
        """``(nq, nb)``: quantized elements and buckets of a ``numel``-value payload."""
        nq = numel - numel % self.bucket_size if self.raw_tail else numel
        return nq, -(-nq // self.bucket_size)

    def encoded_size(self, numel: int, dtype: torch.dtype = torch.float32) -> int:
        _check_dtype(dtype)
        if not isinstance(numel, int) or not 0 <= numel <= 2**48:
            raise ValueError(f"numel must be an integer in [0, 2^48], got {numel!r}")
        nq, nb = self.layout(numel)
        tail = (numel - nq) * dtype.itemsize
        return HEADER_BYTES + 8 * nb + (nq * self.bits + 7) // 8 + tail

    def header(self, numel: int, dtype: torch.dtype, device=None) -> torch.Tensor:
        """The 24 header bytes a payload of ``numel`` values of ``dtype`` starts with: a cached
        device constant (torch_cgx/device/constants.py), never to be written into."""
        raw = [ord(c) for c in "CGXQ"] + [1, DTYPE_CODES[dtype], self.bits, self.flags]
        raw += list(self.bucket_size.to_bytes(4, "little")) + [0] * 4
        raw += list(numel.to_bytes(8, "little"))
        where = torch.device("cpu") if device is None else device
        return constants.bytes_of(tuple(raw), where)

    # ---- encode ---------------------------------------------------------------------------------

    def fusable_input(self, x, seed: int, stream: int, shared: int) -> torch.Tensor:
        """encode's input (codecs/fused.py: the kernel or :meth:`reference_encode`)."""
        x = _flat_input(x)
        _check_seed(seed, stream)
        return x

    def fusable_decode(self, out, payload, dtype=None) -> bool:
        """decode_add_'s checks (the header is not checked here: :meth:`header_ok`)."""
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"out must be a torch.Tensor, got {type(out).__name__}")
        _check_dtype(out.dtype)
        self._check_payload(payload, out.numel(), out.dtype if dtype is None else dtype)
        if payload.device != out.device:
            raise ValueError(f"payload is on {payload.device}, out on {out.device}")
        return out.is_contiguous() and payload.is_contiguous()

    def reference_encode(self, x: torch.Tensor, *, seed: int = 0, stream: int = 0, shared: int = 0):
        """The payload computed with tensor operations only."""
        x = _flat_input(x)
        _check_seed(seed, stream)
        n, dev = x.numel(), x.device
        nq, _ = self.layout(n)
        B = self.bucket_size
        full = nq // B * B
        parts, codes = [self.header(n, x.dtype, dev)], []
        for lo, hi, is_full in ((0, full, True), (full, nq, False)):
            if hi > lo:
                rows = x[lo:hi].float().view(-1, B if is_full else hi - lo)
                meta, c = self._encode_rows(rows, lo, is_full, seed, stream)
                parts.append(meta)
                codes.append(c)
        if codes:
            parts.append(pack_codes(torch.cat(codes), self.bits))
        if nq < n:
            parts.append(x[nq:].clone().view(torch.uint8))
        return torch.cat(parts)

    def _bucket_scalars(self, v: torch.Tensor, is_full: bool):
        """Steps 1-3 of FORMAT.md for every row of the fp32 ``(k, m)`` tensor ``v``: metadata
        ``(mn, unit)``, ``inv`` in fp64 and fp32, and the masks of the fp32 and fp64 paths."""
        finite = torch.isfinite(v).all(1)
        vmn, vmx = v.amin(1), v.amax(1)
        width = vmx.double() - vmn.double()  # unclipped: chooses the path of step 4
        rng, lo = width, vmn.double()
        if self.clip and is_full:
            rng, lo = self._clipped(v, finite, vmn, vmx, width)
        step = _div(rng, self.levels).float()
        valid = finite & (step <= FLT_MAX)  # 1 bit, range > FLT_MAX: the step overflows
        positive = valid & (rng > 0)
        nan = _nan32(v.device)
        mn = lo.float()
        mn = torch.where(mn == 0, torch.zeros_like(mn), mn)  # +0.0 whatever the zeros' signs
        mn = torch.where(valid, mn, nan)
        unit = torch.where(valid, torch.where(positive, step, torch.zeros_like(step)), nan)
        safe = torch.where(positive, rng, torch.ones_like(rng))
        inv_d = torch.where(
            positive, _div(torch.full_like(safe, self.levels), safe), torch.zeros_like(rng)
        )
        f32 = positive & (width <= FLT_MAX) & (inv_d <= FLT_MAX)
        return mn, unit, inv_d, f32, positive & ~f32

    def _clipped(self, v, finite, vmn, vmx, width):
        """FORMAT.md "Clipped range" for full rows: (range, lo) in fp64."""
        n = v.shape[1]
        d = v.double()
        mean = _div(lane_sum(d), n)
        dev = d - mean[:, None]
        var = lane_sum(dev * dev)
        want = CLIP_SIGMAS[self.bits] * torch.sqrt(_div(var, n))
        ok = finite & (width > 0) & (want > 0) & (want < width)
        lo_c = torch.maximum(vmn.double(), torch.minimum(mean - want / 2, vmx.double() - want))
        return torch.where(ok, want, width), torch.where(ok, lo_c, vmn.double())

    def _encode_rows(self, v: torch.Tensor, start: int, is_full: bool, seed: int, stream: int):
        """Metadata bytes and codes (int32, row-major) of the buckets in the rows of ``v``, whose
        first element is element ``start`` of the buffer."""
        mn, unit, inv_d, f32, f64 = self._bucket_scalars(v, is_full)
        if self.stochastic:
            index = torch.arange(start, start + v.numel(), dtype=torch.int64, device=v.device)
            r32 = uniform(seed, stream, index).view(v.shape)
            r64 = r32.double()
        else:
            r32, r64 = 0.5, 0.5
        top = float(self.levels)
        t32 = (v - mn[:, None]) * inv_d.float()[:, None]
        q = torch.floor(t32 + r32).clamp_(0.0, top)
        q = torch.where(f32[:, None], q, torch.zeros_like(q))
        # The fp64 path for every element, selected per bucket; on the CPU, asking whether any
        # bucket needs it costs no device synchronisation, so it is skipped when none does.
        if v.device.type != "cpu" or bool(f64.any()):
            t64 = (v.double() - mn.double()[:, None]) * inv_d[:, None]
            q64 = torch.floor(t64 + r64).clamp_(0.0, top).float()
            q = torch.where(f64[:, None], q64, q)
        meta = torch.stack([mn, unit], 1).contiguous().view(torch.uint8).view(-1)
        return meta, q.to(torch.int32).view(-1)

    # ---- decode ---------------------------------------------------------------------------------

    def _check_payload(self, payload: torch.Tensor, numel: int, dtype: torch.dtype) -> None:
        if (
            not isinstance(payload, torch.Tensor)
            or payload.dtype != torch.uint8
            or payload.dim() != 1
        ):
            raise ValueError("payload must be a 1-D uint8 tensor (what encode returned)")
        want = self.encoded_size(numel, dtype)
        if payload.numel() != want:
            raise ValueError(f"maxmin payload holds {payload.numel()} bytes; {numel} values of "
                             f"{dtype} at bits={self.bits}, bucket_size={self.bucket_size} take "
                             f"{want}")  # fmt: skip

    def values(self, payload: torch.Tensor, numel: int, dtype: torch.dtype) -> torch.Tensor:
        self._check_payload(payload, numel, dtype)
        nq, nb = self.layout(numel)
        dev = payload.device
        meta = payload[HEADER_BYTES : HEADER_BYTES + 8 * nb].clone().view(torch.float32).view(nb, 2)
        mn, unit = meta[:, 0], meta[:, 1]
        bound = mn.double().abs() + self.levels * unit.double().abs()
        fast = bound <= FLT_MAX  # NaN metadata takes the fp64 path and stays NaN
        q = unpack_codes(payload[HEADER_BYTES + 8 * nb :], nq, self.bits).float()
        B, full = self.bucket_size, nq // self.bucket_size
        rows = [(q[: full * B].view(full, B), slice(0, full))] if full else []
        if nq > full * B:
            rows.append((q[full * B :].view(1, -1), slice(full, full + 1)))
        out = [self._dequantize(c, mn[k, None], unit[k, None], fast[k, None]) for c, k in rows]
        if nq < numel:
            tail_at = payload.numel() - (numel - nq) * dtype.itemsize
            out.append(payload[tail_at:].clone().view(dtype).float().view(1, -1))
        if not out:
            return torch.zeros(0, dtype=torch.float32, device=dev)
        return torch.cat([o.reshape(-1) for o in out])

    @staticmethod
    def _dequantize(q, mn, unit, fast) -> torch.Tensor:
        """FORMAT.md "Decoding one element" for rows of codes ``q`` (fp32) with their bucket's
        ``(mn, unit)``: fp32 where ``|mn| + L |unit| <= FLT_MAX``, else fp64 then rounded."""
        v = mn + q * unit
        if q.device.type != "cpu" or not bool(fast.all()):  # CPU: skipped when no bucket needs it
            v = torch.where(fast, v, (mn.double() + q.double() * unit.double()).float())
        return v

    def header_ok(self, payload: torch.Tensor, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """Every header byte as expected except the informational flag bits (stochastic, clip),
        like the CUDA decoder's check; False for a payload shorter than the header."""
        if payload.numel() < HEADER_BYTES:
            return torch.zeros((), dtype=torch.bool, device=payload.device)
        want = self.header(numel, dtype, payload.device)
        # a cached device constant: writing a Python int into a device tensor is a host-to-device
        # copy that waits for the host (the GPU check's sync step found it here)
        mask = constants.bytes_of((0xFF,) * 7 + (FLAG_RAW_TAIL,) + (0xFF,) * 16, payload.device)
        return ((payload[:HEADER_BYTES] & mask) == (want & mask)).all()


def _check_dtype(dtype) -> None:
    if dtype not in DTYPE_CODES:
        raise ValueError(f"dtype must be float32, float16 or bfloat16, got {dtype}")


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """FORMAT.md's code stream of the int32 ``codes`` (each < 2^bits): each group of 8 codes is
    one 64-bit word ``sum(code_j << (j * bits))`` whose ``bits`` low bytes are the group's bytes;
    ``ceil(n * bits / 8)`` bytes (base.pack_bits' stream, in about a tenth of the passes)."""
    n = codes.numel()
    groups = -(-n // 8)
    if n == 0:
        return torch.zeros(0, dtype=torch.uint8, device=codes.device)
    c = codes.to(torch.int64)
    if groups * 8 != n:
        c = torch.cat([c, c.new_zeros(groups * 8 - n)])
    c = c.view(groups, 8)
    word = torch.zeros(groups, dtype=torch.int64, device=codes.device)
    for j in range(8):
        word |= c[:, j] << (j * bits)
    return word.view(torch.uint8).view(groups, 8)[:, :bits].reshape(-1)[: (n * bits + 7) // 8]


def unpack_codes(data: torch.Tensor, n: int, bits: int) -> torch.Tensor:
    """The first ``n`` codes (int32) of a stream written by :func:`pack_codes`."""
    if n == 0:
        return torch.zeros(0, dtype=torch.int32, device=data.device)
    groups = -(-n // 8)
    raw = data[: (n * bits + 7) // 8]
    stream = torch.zeros(groups * bits, dtype=torch.uint8, device=data.device)
    stream[: raw.numel()] = raw
    words = torch.zeros(groups, 8, dtype=torch.uint8, device=data.device)
    words[:, :bits] = stream.view(groups, bits)
    word = words.view(torch.int64).view(groups, 1)
    shifts = torch.arange(0, 8 * bits, bits, dtype=torch.int64, device=data.device)
    codes = (word >> shifts) & ((1 << bits) - 1)  # arithmetic shift: the mask drops the sign
    return codes.view(-1)[:n].to(torch.int32)


def _check_seed(seed, stream) -> None:
    for what, v in (("seed", seed), ("stream", stream)):
        if not isinstance(v, int) or not 0 <= v < 2**64:
            raise ValueError(f"{what} must be an integer in [0, 2^64), got {v!r}")


def _flat_input(x) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"maxmin encodes a torch.Tensor, got {type(x).__name__}")
    _check_dtype(x.dtype)
    return x.detach().reshape(-1).contiguous()


CODECS = {"maxmin": MaxMin}
