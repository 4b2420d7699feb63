"""Fused topk / randomk / threshold / dgc / graddrop / sparseloco in Triton:
:class:`TritonSparse`, byte for byte the native codecs (the kernels: ``sparse_kernels.py``,
imported by :meth:`TritonSparse.load`).

The device codecs (torch_cgx/device/codecs/sparse.py, sparseloco.py) take their primitives from
an object: the tensor-op reference ``sparse_select.REFERENCE`` or :class:`TritonPrims` here.
What is fused, each a single kernel where the reference runs the listed tensor ops:

- ``order_keys`` (top-k's unique int64 keys: float, view, and, clamp, widen, shift, arange,
  subtract, or);
- random_k's draws (two ``rng_bits`` of about 20 int64 ops each, four int64 remainders, the
  link of Floyd's chain: about 60 ops), its repeat flags (fill, compare, scatter) and each
  pointer-jumping round (about 8 ops; the last one also forms the picks);
- the sampled threshold's draws and the gather of their magnitudes, and the threshold's
  mask (``magnitude_bits(x) >= thr``: 5 ops);
- the payload: envelope, u32 indices and gathered values in one launch (the reference gathers,
  slices the int64 indices' bytes and concatenates); randomk's decode spreads a non-finite flag
  by writing NaN only where the payload has it (the reference: three passes over ``out``);
- sparseloco's body after its per-chunk selection: two launches (``sparse_loco_kernels``) for
  the reference's ~40 ops (gather, the scalars, the codes, the code stream, cat).

What stays in torch: the selection (``torch.topk``, ``torch.sort``, ``torch.kthvalue``,
``torch.nonzero``): one library call each, itself a few kernels, that no elementwise kernel
replaces. Every launch is on the caller's current stream; no host synchronisation beyond the
reference's (``nonzero``).
"""

from __future__ import annotations

import contextlib

import torch

from torch_cgx.device.codecs import sparse_select as sel

__all__ = ["TritonPrims", "TritonSparse"]

_KIND = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
_BITS = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}


def index64(*extents: int) -> bool:
    """Whether an extent reaches ``INDEX32_LIMIT`` (read at the call: tests lower it)."""
    from torch_cgx.device import triton as cgx_triton

    return cgx_triton.index64(*extents)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _options(device: torch.device) -> dict:
    """Launch options of the kernels with float arithmetic (sparseloco's): no fused
    multiply-add, no flush of fp32 denormals (TritonLevels' options)."""
    from torch_cgx.device.triton.levels import TritonLevels

    return TritonLevels._options(device)


def _on(device: torch.device):
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


class TritonPrims:
    """The sparse codecs' primitives (``sparse_select.Reference``'s methods) through the kernels
    of ``sparse_kernels``; ``block``: elements per program."""

    def __init__(self, kernels, block: int = 1024) -> None:
        self.k = kernels
        self.block = block

    def _grid(self, n: int) -> tuple:
        return (max(1, _cdiv(n, self.block)),)

    def order_keys_of(self, x: torch.Tensor, index=None, row: int = 0) -> torch.Tensor:
        """``order_keys`` of ``x`` at ``index`` (int64), at the positions in rows of ``row``
        values (``row > 0``), or at the positions."""
        n = x.numel()
        keys = torch.empty(n, dtype=torch.int64, device=x.device)
        if n:
            with _on(x.device):
                self.k.keys_kernel[self._grid(n)](
                    x.view(_BITS[x.dtype]), keys if index is None else index, keys, n,
                    max(row, 1), KIND=_KIND[x.dtype], HAS_INDEX=index is not None,
                    ROWS=row > 0, BLOCK=self.block, WIDE=index64(n + self.block, row),
                )  # fmt: skip
        return keys

    def top_k(self, x: torch.Tensor, k: int, index=None) -> torch.Tensor:
        n = x.numel()
        k = max(0, min(k, n))
        if k == n:
            return torch.arange(n, dtype=torch.int64, device=x.device) if index is None else index
        chosen = torch.topk(self.order_keys_of(x, index), k, sorted=False).indices
        return torch.sort(chosen if index is None else index[chosen]).values

    def row_top_k(self, rows: torch.Tensor, k: int) -> torch.Tensor:
        r, length = rows.shape
        if k >= length:
            index = torch.arange(length, dtype=torch.int64, device=rows.device)
            return index.expand(r, length).contiguous()
        keys = self.order_keys_of(rows.reshape(-1), row=length).view(r, length)
        top = torch.topk(keys, k, dim=1, sorted=False).values
        return torch.sort(0xFFFFFFFF - (top & 0xFFFFFFFF), dim=1).values

    def random_k(self, n: int, k: int, key, device=None) -> torch.Tensor:
        """``prim::random_k``; ``key``: host words ``(k0, k1)`` or the 8 key bytes (uint8 tensor,
        a payload's bytes 24..31) on ``device``."""
        k = max(0, min(k, n))
        if k == n or k == 0:
            return torch.arange(k, dtype=torch.int64, device=device)
        kk, base, grid = self.k, n - k, self._grid(k)
        on_device = isinstance(key, torch.Tensor)
        k0, k1 = (0, 0) if on_device else key
        r = torch.empty(k, dtype=torch.int64, device=device)
        link = [torch.empty_like(r), torch.empty_like(r)]
        taken = [torch.empty(k, dtype=torch.int8, device=device) for _ in range(2)]
        with _on(r.device):
            kk.draw_kernel[grid](
                key if on_device else r, k0, k1, r, link[0], r, k, base, KEY_PTR=on_device,
                SAMPLE=False, KIND=0, BLOCK=self.block)  # fmt: skip
            order = torch.sort(r, stable=True)
            kk.repeat_kernel[grid](order.values, order.indices, taken[0], k, BLOCK=self.block)
            rounds = k.bit_length()
            for i in range(rounds):
                a, b = i % 2, 1 - i % 2
                kk.jump_kernel[grid](
                    taken[a], link[a], taken[b], link[b], r, order.values, k, base,
                    LAST=i == rounds - 1, BLOCK=self.block)  # fmt: skip
        return torch.sort(order.values).values  # the last round wrote the picks there

    def sampled_mask(self, x: torch.Tensor, k: int, sample: int, k0: int, k1: int):
        """(``magnitude_bits(x) >= thr`` bool, ``thr``) for the sampled threshold ``thr``: the
        draws and the gather of their magnitudes one kernel, the mask another."""
        n = x.numel()
        if n == 0 or k <= 0 or sample >= n:
            from torch_cgx.device.codecs import sparse_select as sel

            thr = sel.sampled_threshold(sel.magnitude_bits(x), k, sample, k0, k1)
            return self.at_least(x, thr), thr
        s = max(sample, 1)
        chosen = torch.empty(s, dtype=torch.int32, device=x.device)
        with _on(x.device):
            self.k.draw_kernel[self._grid(s)](
                chosen, k0, k1, chosen, chosen, x.view(_BITS[x.dtype]), s, n, KEY_PTR=False,
                SAMPLE=True, KIND=_KIND[x.dtype], BLOCK=self.block)  # fmt: skip
        ks = max(1, min((k * s + n - 1) // n, s))
        thr = torch.kthvalue(chosen.view(torch.float32), s - ks + 1).values.view(torch.int32)
        return self.at_least(x, thr), thr

    def at_least(self, x: torch.Tensor, thr) -> torch.Tensor:
        """``magnitude_bits(x) >= thr`` (bool); ``thr`` host bits or a 0-d int32 tensor."""
        n = x.numel()
        out = torch.empty(n, dtype=torch.int8, device=x.device)
        if n:
            on_device = isinstance(thr, torch.Tensor)
            with _on(x.device):
                self.k.mask_kernel[self._grid(n)](
                    x.view(_BITS[x.dtype]), thr if on_device else out, out, n,
                    0 if on_device else thr, KIND=_KIND[x.dtype], FROM_PTR=on_device,
                    BLOCK=self.block)  # fmt: skip
        return out.view(torch.bool)

    def loco_payload(self, codec, x: torch.Tensor, s, head: torch.Tensor, idxs) -> torch.Tensor:
        """sparseloco's payload after the per-chunk selection ``idxs`` (one ``(rows, k)`` int64
        per block of ``s``, the codec's Shape): the envelope ``head``, then the rows' scalars
        and indices (one program per chunk), then the code stream (groups of eight)."""
        from torch_cgx.device.codecs.sparse_select import count_for

        lk = self.loco_kernels()
        idx = idxs[0].reshape(-1) if len(idxs) == 1 else torch.cat([i.reshape(-1) for i in idxs])
        out = torch.empty(32 + s.body, dtype=torch.uint8, device=x.device)
        out[:32].copy_(head)
        n, chunk, bits = x.numel(), codec.chunk, codec.bits
        full, tail = divmod(n, chunk)
        k_full = count_for(codec.ratio, chunk)
        k_tail = count_for(codec.ratio, tail) if tail else 0
        meta = dict(KIND=_KIND[x.dtype], BITS=bits, LEVELS=codec.levels)
        xb, groups, opts = x.view(_BITS[x.dtype]), _cdiv(s.kept, 8), _options(x.device)
        bk = min(1024, 1 << (max(k_full, k_tail, 1) - 1).bit_length())
        with _on(x.device):
            lk.loco_rows_kernel[(s.chunks,)](
                xb, idx, out, chunk, full, k_full, k_tail, 32 + s.idx_off, **meta,
                WIDTH=codec.width, BK=max(bk, 16), **opts)  # fmt: skip
            g = max(1, min(128, self.block // 8))
            lk.loco_codes_kernel[(_cdiv(groups, g),)](
                xb, idx, out, s.kept, chunk, full, k_full, 32 + s.codes_off,
                (s.kept * bits + 7) // 8, **meta, G=g,
                WIDE=index64(8 * g * _cdiv(groups, g), n + chunk), **opts)  # fmt: skip
        return out

    def loco_kernels(self):
        from torch_cgx.device.triton import sparse_loco_kernels

        return sparse_loco_kernels

    def nan_if_flagged(self, out: torch.Tensor, payload: torch.Tensor) -> torch.Tensor:
        """``out`` all NaN where the payload flags a non-finite input, else untouched: each
        program reads the flags byte and writes only then (the reference reads and writes
        ``out`` three times whatever the flag)."""
        if not out.is_contiguous() or out.dtype not in _KIND or out.numel() == 0:
            return sel.REFERENCE.nan_if_flagged(out, payload)
        n = out.numel()
        with _on(out.device):
            self.k.flagged_nan_kernel[self._grid(n)](
                payload, out.view(_BITS[out.dtype]), n, KIND=_KIND[out.dtype], BLOCK=self.block
            )
        return out

    def pack(self, head: torch.Tensor, idx: torch.Tensor, x: torch.Tensor, index: bool):
        """The payload: ``head`` (32 bytes), the u32 ``idx`` (``index``), the values ``x[idx]``."""
        m, es = idx.numel(), x.element_size()
        val_off = 32 + 4 * m * index
        out = torch.empty(val_off + es * m, dtype=torch.uint8, device=x.device)
        if m == 0:  # nothing selected: the envelope only (no launch with an empty index)
            return out.copy_(head)
        with _on(x.device):
            self.k.pack_kernel[self._grid(m)](
                head, idx, x.view(_BITS[x.dtype]), out, m, val_off, INDEX=index, ES=es,
                BLOCK=self.block)  # fmt: skip
        return out


class TritonSparse:
    """The Triton kernels of the sparse codecs (the :class:`torch_cgx.device.fused.FusedMaxMin`
    protocol, with ``shared`` for randomk): CUDA tensors where triton is installed, CPU tensors
    under Triton's interpreter (``TRITON_INTERPRET=1``)."""

    name = "triton-sparse"

    @property
    def codecs(self):
        from torch_cgx.device.codecs import family

        return family("sparse")

    def __init__(self, block: int = 1024) -> None:
        if block < 32 or block & (block - 1):
            raise ValueError(f"block must be a power of two >= 32, got {block}")
        self.block = block
        self._prims = None

    def applies(self, device: torch.device) -> bool:
        from torch_cgx.device.triton import available

        return available(torch.device(device))

    def supports(self, codec, dtype: torch.dtype) -> bool:
        return codec.name in self.codecs and dtype in _KIND

    def load(self) -> None:
        """Imports triton and the kernels (ImportError where triton is missing)."""
        if self._prims is None:
            from torch_cgx.device.triton import sparse_kernels

            self._prims = TritonPrims(sparse_kernels, self.block)

    def encode(self, codec, x: torch.Tensor, seed: int, stream: int, shared: int = 0):
        self.load()
        return codec.reference_encode(x, seed=seed, stream=stream, shared=shared, prims=self._prims)

    def decode_add_(self, codec, out: torch.Tensor, payload: torch.Tensor, dtype=None):
        self.load()
        return codec.reference_decode_add_(out, payload, dtype, prims=self._prims)
