"""The hook core (torch_cgx/hooks/core.py): the table of the presets' defaults in docs/hooks.md
against what each preset does, one name for the minimum size (old names as aliases), and native
call options built once per version of the group's settings, never per gradient bucket."""

from __future__ import annotations

import pathlib

import pytest
import torch
import torch.distributed as dist
from dist_helpers import run_ranks

DOC = pathlib.Path(__file__).resolve().parent.parent / "docs" / "hooks.md"
PRESETS = ("cgx_hook", "compression_hook", "policy_hook", "fsdp.compress")


def defaults_table():
    """{setting: {preset: cell}} of docs/hooks.md's table of defaults."""
    text = DOC.read_text()
    start = text.index("| setting | `cgx_hook` |")
    rows = {}
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = dict(zip(PRESETS, cells[1:]))
    return rows


def policy_choice_state():
    from torch_cgx.compression import (
        NoCompression,
        SizeAdaptiveCompression,
        Uniform8BitQuantization,
    )
    from torch_cgx.compression.ddp import PolicyState

    model = torch.nn.Linear(64, 64)
    policy = SizeAdaptiveCompression(1024, NoCompression(), Uniform8BitQuantization())
    state = PolicyState(model, policy)
    return state.state_of(model.weight)  # the compressed choice's CompressionState


def actual_defaults():
    """{setting: {preset: value}}, read from the objects (no process group needed)."""
    from torch_cgx import fsdp
    from torch_cgx.hooks import CGXState, CompressionState

    cgx, comp, sub = CGXState(), CompressionState(), policy_choice_state()
    rs = fsdp.CompressedReduceScatter()
    at4, at8 = cgx.resolved(4), cgx.resolved(8)
    # "auto": the backend's rule (rotate at 1-4 bits with a power-of-two bucket; clip with it)
    cgx_rotation = "auto" if at4["rotation"] and not at8["rotation"] else at4["rotation"]
    cgx_clip = "auto" if at4["clip"] and not at8["clip"] else at4["clip"]
    on = {True: "on", False: "off"}
    return {
        "bits": {
            "cgx_hook": "group" if "bits" not in cgx.compression_params else None,
            "compression_hook": str(comp.params["bits"]),
            "policy_hook": "choice" if sub.params.get("bits") == 8 else None,
            "fsdp.compress": str(rs.codec.parameters["bits"]),
        },
        "bucket_size": {
            "cgx_hook": "group" if "bucket_size" not in cgx.compression_params else None,
            "compression_hook": "group" if "bucket_size" not in comp.params else None,
            # Uniform8BitQuantization(bucket_size=None): the group's, as the policy chose
            "policy_hook": "choice" if "bucket_size" not in sub.params else None,
            "fsdp.compress": str(
                int(rs.codec.parameters.get("bucket_size", _maxmin_default("bucket_size")))
            ),
        },
        "error_feedback": {
            "cgx_hook": on[at4["error_feedback"]],
            "compression_hook": "biased" if comp.error_feedback else "off",
            "policy_hook": "biased" if sub.error_feedback else "off",
            "fsdp.compress": "off",  # the reduce-scatter has no residuals at all
        },
        "rotation": {
            "cgx_hook": cgx_rotation,
            "compression_hook": "group",
            "policy_hook": "group",
            "fsdp.compress": "off",
        },  # fmt: skip
        "clip": {
            "cgx_hook": cgx_clip,
            "compression_hook": "group",
            "policy_hook": "group",
            "fsdp.compress": "off" if not rs.codec.parameters.get("clip") else "on",
        },  # fmt: skip
        "min_size": {
            "cgx_hook": str(cgx.min_size),
            "compression_hook": str(comp.min_size),
            "policy_hook": str(sub.min_size),
            "fsdp.compress": str(rs.min_size),
        },
        "split_layers": {
            "cgx_hook": on[at4["split_layers"]],
            "compression_hook": "off",
            "policy_hook": "off",
            "fsdp.compress": "off",
        },  # fmt: skip
        "momentum": {
            "cgx_hook": "0",
            "compression_hook": f"{comp.momentum:g}",
            "policy_hook": f"{sub.momentum:g}",
            "fsdp.compress": "0",
        },
    }


def _maxmin_default(name):
    from torch_cgx import compressors

    return next(p["default"] for p in compressors.params("maxmin") if p["name"] == name)


def test_defaults_table_matches_the_presets():
    table, actual = defaults_table(), actual_defaults()
    assert set(table) == set(actual), "every row of the table is checked"
    for setting, cells in table.items():
        assert cells == actual[setting], setting


def test_compression_hook_and_group_settings_are_the_groups():
    """'group' in the table: compression_hook's call takes the group's rotation, clip and
    bucket size (nothing of its own overrides them)."""
    from torch_cgx.config import CGXConfig
    from torch_cgx.hooks import CompressionState

    group = CGXConfig(bucket_size=64, rotation="auto", clip="on")
    call = CompressionState().settings(group)
    assert (call.bits, call.bucket_size, call.rotation, call.clip) == (4, 64, "auto", "on")
    assert CompressionState(params={"bits": 2, "bucket_size": 8}).settings(group).bucket_size == 8


def test_rotation_default_follows_the_backend_rule():
    from torch_cgx import _C
    from torch_cgx.hooks import CGXState

    s = CGXState()
    for bits in range(1, 9):
        for bucket in (64, 500, 512):
            rule = _C.rotation_rule("auto", bits, bucket, "maxmin")
            assert s.resolved(bits, bucket_size=bucket)["rotation"] == rule
            assert s.resolved(bits, bucket_size=bucket)["clip"] == _C.clip_rule("auto", rule)
    assert not s.resolved(4, bucket_size=500)["rotation"]  # auto: not where it cannot rotate
    with pytest.raises(ValueError, match="power of two"):
        CGXState(compression_params={"bucket_size": 500}, rotation=True)


def test_min_size_is_the_one_name_and_old_names_stay_aliases():
    import pickle

    from torch_cgx import fsdp
    from torch_cgx.hooks import CGXState, CompressionState

    assert CGXState(None, 7).min_size == 7  # CGX's positional second argument
    assert CGXState(layer_min_size=9).min_size == 9 and CGXState(min_size=9).layer_min_size == 9
    assert CompressionState(layer_min_size=5).min_size == 5
    assert CompressionState(min_size=6).min_size == 6
    with pytest.raises(ValueError, match="not both"):
        CGXState(min_size=1, layer_min_size=2)
    with pytest.raises(ValueError, match="min_size must be"):
        CompressionState(min_size=-1)
    with pytest.raises(ValueError, match="layer_min_size must be"):
        CompressionState(layer_min_size=True)
    rs = fsdp.CompressedReduceScatter(min_numel=100)
    assert rs.min_size == 100 and rs.min_numel == 100
    assert fsdp.CompressedAllGather(min_size=50).min_numel == 50
    with pytest.raises(ValueError, match="min_numel must be"):
        fsdp.CompressedAllGather(min_numel=-3)
    # A state saved before the rename loads under the new name.
    s = CGXState.__new__(CGXState)
    s.__setstate__({"layer_min_size": 11, "compression_params": {"bits": 4}})
    assert s.min_size == 11
    assert pickle.loads(pickle.dumps(CompressionState(min_size=12))).min_size == 12


def _bucket_size_of(options) -> int:
    return getattr(options, "config", options).bucket_size


def body_built_once(rank, world):
    import torch_cgx
    from torch_cgx import config as config_module
    from torch_cgx.compression import (
        NoCompression,
        SizeAdaptiveCompression,
        Uniform8BitQuantization,
    )
    from torch_cgx.compression.ddp import PolicyState, policy_hook
    from torch_cgx.hooks import CGXState, CompressionState, cgx_hook, compression_hook, core

    dist.init_process_group("cgx")
    torch_cgx.set_config(bucket_size=128)
    counts = {"native": 0, "from_native": 0}
    real_native, real_from = core._native, config_module.CGXConfig.from_native.__func__

    def counting_native(config):
        counts["native"] += 1
        return real_native(config)

    def counting_from(cls, native):
        counts["from_native"] += 1
        return real_from(cls, native)

    core._native = counting_native
    config_module.CGXConfig.from_native = classmethod(counting_from)

    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64))

    policy = SizeAdaptiveCompression(1024, NoCompression(), Uniform8BitQuantization())
    hooks = {
        "cgx": lambda m: (CGXState(None, 1024, {"bits": 4}, module=m), cgx_hook),
        "compression": lambda m: (
            CompressionState(None, min_size=1024, module=m),
            compression_hook,
        ),  # fmt: skip
        "policy": lambda m: (PolicyState(m, policy), policy_hook),
    }
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(rank))
    for name, make in hooks.items():
        torch_cgx.set_config(bucket_size=128)
        m = model()
        # Small gradient buckets: each step makes several hook calls.
        ddp = torch.nn.parallel.DistributedDataParallel(m, bucket_cap_mb=0.01)
        state, hook = make(m)
        ddp.register_comm_hook(state, hook)

        def step(ddp=ddp):
            ddp.zero_grad()
            ddp(x).square().sum().backward()

        step()  # the first step builds what the state's calls need
        for k in counts:
            counts[k] = 0
        for _ in range(4):
            step()
        assert counts == {"native": 0, "from_native": 0}, (name, counts)
        torch_cgx.set_config(bucket_size=256)  # a new version of the group's settings
        counts["from_native"] = 0  # set_config reads the settings itself
        step()
        assert counts["native"] >= 1 and counts["from_native"] >= 1, (name, counts)
        subs = list(state.states.values()) if name == "policy" else [state]
        built = [v for s in subs for k, v in s._calls._cache.items()
                 if isinstance(k, tuple) and k[0] == "options"]  # fmt: skip
        assert built, name
        if name != "policy":  # the group's bucket size, read again
            assert all(_bucket_size_of(o) == 256 for o in built), name
        for k in counts:
            counts[k] = 0
        step()
        assert counts == {"native": 0, "from_native": 0}, (name, counts)
    dist.destroy_process_group()


def test_hook_states_build_native_options_once_per_settings_version():
    run_ranks(body_built_once, 2, timeout=180)
