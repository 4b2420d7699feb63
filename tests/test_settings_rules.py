"""Each setting's rule lives in the table (torch_cgx/settings.py) and every layer follows it: the
native side through the generated csrc/torch/settings_rules.h (checked current here, and the
build's compiled rules checked against the table), the typed config, the device plane and the
entry points' min_size defaults by reading the table when they run (a rule changed here changes
them)."""

from __future__ import annotations

import dataclasses
import importlib.util
import pathlib

import pytest

from torch_cgx import _C, settings, settings_doc
from torch_cgx.config import CGXConfig
from torch_cgx.device import rotation as device_rotation
from torch_cgx.device.call import DeviceCall
from torch_cgx.hooks import levers

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _generator():
    spec = importlib.util.spec_from_file_location(
        "settings_rules", ROOT / "scripts" / "settings_rules.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _replace(monkeypatch, name: str, **changes) -> None:
    """Setting ``name`` changed in every view of the table (SETTINGS, GROUP_SETTINGS, BY_NAME)."""
    new = dataclasses.replace(settings.BY_NAME[name], **changes)
    for attr in ("SETTINGS", "GROUP_SETTINGS"):
        swapped = tuple(new if s.name == name else s for s in getattr(settings, attr))
        monkeypatch.setattr(settings, attr, swapped)
    monkeypatch.setitem(settings.BY_NAME, name, new)


def test_the_checked_in_header_is_what_the_table_makes():
    text = (ROOT / "csrc" / "torch" / "settings_rules.h").read_text()
    assert text == _generator().render(), "settings_rules.h is stale: run `make settings-doc`"


def test_the_build_was_compiled_with_the_tables_rules():
    compiled = _C._settings_rules()
    for name in ("bits", "bucket_size", "min_size", "fusion_buffer_mb", "pipeline_segment_mb"):
        s = settings.BY_NAME[name]
        r = s.check
        also = s.to_native(r.also[0]) if r.also else s.to_native(r.lo)
        assert compiled[name] == (s.to_native(r.lo), s.to_native(r.hi), also, r.text), name
    assert compiled["call_vars"] == [settings.BY_NAME[n].env for n in settings.CALL_SETTINGS]
    assert compiled["rotation_blocks"] == (*settings.ROTATION_BLOCKS, settings.ROTATION_BLOCKS_TEXT)
    assert compiled["min_size_floor"] == settings.MIN_SIZE_FLOOR


def test_native_messages_are_the_tables():
    cases = [
        ({"bits": 9}, settings.BY_NAME["bits"].check.text),
        ({"bucket_size": 0}, settings.BY_NAME["bucket_size"].check.text),
        ({"rotation": "on", "bucket_size": 3}, settings.ROTATION_BLOCKS_TEXT),
    ]
    for fields, text in cases:
        native = _C.BackendConfig()
        for k, v in fields.items():
            setattr(native, k, v)
        with pytest.raises(ValueError) as e:
            _C.CallOptions(native)
        assert text in str(e.value)
    with pytest.raises(ValueError) as e:
        CGXConfig(bucket_size=0)
    assert settings.BY_NAME["bucket_size"].check.text in str(e.value)


def test_a_changed_range_changes_the_generated_header(monkeypatch):
    gen = _generator()
    table = gen.load_table()
    wider = table.IntRange(1, 16, also=(32,), text="must be 1..16")
    bits = dataclasses.replace(table.BY_NAME["bits"], check=wider)
    bucket = dataclasses.replace(table.BY_NAME["bucket_size"], default=256)
    swap = {"bits": bits, "bucket_size": bucket}
    monkeypatch.setattr(table, "GROUP_SETTINGS",
                        tuple(swap.get(s.name, s) for s in table.GROUP_SETTINGS))  # fmt: skip
    monkeypatch.setattr(table, "ROTATION_BLOCKS", (2, 1 << 10))
    text = gen.render(table)
    assert 'kBitsRange{1, 16, 32, "must be 1..16"}' in text
    assert '"CGX_COMPRESSION_BUCKET_SIZE", 256}' in text
    assert "kRotationMaxBlock = 1024;" in text


def test_a_changed_bits_range_changes_the_python_layers(monkeypatch):
    _replace(monkeypatch, "bits", check=settings.IntRange(1, 16, also=(32,), text="must be 1..16"))
    config = CGXConfig(bits=12)  # the typed config's check is the table's
    assert settings.quantizes(12) and config.compressed
    call = DeviceCall.from_config(config, average=True)  # the device plane compresses it
    assert call is not None and call.param("bits") == 12
    with pytest.raises(ValueError, match="bits must be 1..16"):
        CGXConfig(bits=17)


def test_changed_rotation_blocks_change_the_config_and_the_device_plane(monkeypatch):
    monkeypatch.setattr(settings, "ROTATION_BLOCKS", (2, 256))
    assert not device_rotation.valid_block(512) and device_rotation.valid_block(256)
    assert not levers.valid_rotation_block(512)  # the hooks' per-layer rotation
    with pytest.raises(ValueError, match="rotation"):
        CGXConfig(rotation="on", bucket_size=512)
    with pytest.raises(ValueError, match="rotation needs"):
        DeviceCall("maxmin", (("bits", 4.0), ("bucket_size", 512.0)), rotation=True)


def test_min_size_defaults_come_from_the_table(monkeypatch):
    from torch_cgx import fsdp
    from torch_cgx.hooks.cgx import CGXState
    from torch_cgx.hooks.compression import CompressionState

    assert settings.min_size_default("group") == settings.BY_NAME["min_size"].default
    assert CGXState().min_size == settings.min_size_default("hooks")
    monkeypatch.setitem(settings.MIN_SIZE_DEFAULTS, "hooks", (7, "a test"))
    monkeypatch.setitem(settings.MIN_SIZE_DEFAULTS, "fsdp", (9, "a test"))
    assert CGXState().min_size == 7 and CompressionState().min_size == 7
    assert fsdp.CompressedReduceScatter().min_size == 9
    assert fsdp.CompressedAllGather().min_size == 9
    doc = settings_doc.markdown()
    for entry, (default, _) in settings.MIN_SIZE_DEFAULTS.items():
        assert f"| {entry} | {default} |" in doc
