"""CGX-compatible import path: ``from cgx_utils import cgx_hook, CGXState``.

The hook and its state arrive with the cgx backend (torch_cgx.hooks); this module re-exports them.
"""
