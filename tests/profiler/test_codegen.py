"""profiler.codegen: the generated headers and tables match their sources, and drift is caught."""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from profiler import codegen
from profiler.generated import layout as L
from profiler.registry import load_all


def test_checkout_generated_files_are_fresh():
    assert codegen.main(["--check"]) == 0, "run `python -m profiler.codegen` and commit the result"


@pytest.fixture
def gen_dirs(tmp_path, monkeypatch):
    cuh, py = tmp_path / "cuh", tmp_path / "py"
    monkeypatch.setattr(codegen, "CUH_DIR", cuh)
    monkeypatch.setattr(codegen, "PY_DIR", py)
    # ROOT.parent is used to print relative paths; keep it a parent of the temp dirs
    monkeypatch.setattr(codegen, "ROOT", tmp_path / "profiler")
    return cuh, py


def test_regenerate_into_temp_then_check_round_trip(gen_dirs):
    cuh, py = gen_dirs
    assert codegen.main([]) == 0
    assert codegen.stale_files() == []
    assert codegen.main(["--check"]) == 0
    # the temp copy is byte-identical to the committed one
    for p in py.glob("*.py"):
        assert p.read_text() == (codegen.Path(codegen.__file__).parent / "generated" / p.name).read_text()


def test_check_fails_on_edited_and_orphan_files(gen_dirs, capsys):
    cuh, py = gen_dirs
    codegen.main([])
    (cuh / "layout.cuh").write_text((cuh / "layout.cuh").read_text() + "// hand edit\n")
    (py / "old_family_phases.py").write_text("FAMILY = 'old'\n")
    bad = {p.name for p in codegen.stale_files()}
    assert bad == {"layout.cuh", "old_family_phases.py"}
    assert codegen.main(["--check"]) == 1
    assert "stale:" in capsys.readouterr().err


def test_generated_dtypes_follow_declared_sizes_and_offsets():
    lay = codegen.load_layout()
    dtypes = {"BufferHeader": L.BUFFERHEADER_DTYPE, "RegionHeader": L.REGIONHEADER_DTYPE, "Record": L.RECORD_DTYPE}
    for s in lay["struct"]:
        dt = dtypes[s["name"]]
        assert dt.itemsize == s["size"]
        off = 0
        for name, typ, _ in s["fields"]:
            assert dt.fields[name][1] == off
            off += codegen._SIZES[typ]
    assert L.MAGIC == lay["magic"] and L.VERSION == lay["version"]


def test_layout_header_has_static_asserts_for_every_field():
    text = codegen.layout_cuh(codegen.load_layout())
    for name in L.RECORD_DTYPE.names:
        assert f"offsetof(Record, {name})" in text
    assert 'static_assert(sizeof(Record) == 16' in text


def test_layout_rejects_padding(tmp_path, monkeypatch):
    bad = codegen.LAYOUT_TOML.read_text().replace('["id", "u16"', '["id", "u8"', 1)
    p = tmp_path / "layout.toml"
    p.write_text(bad)
    monkeypatch.setattr(codegen, "LAYOUT_TOML", p)
    with pytest.raises(ValueError, match="Record"):
        codegen.load_layout()


def test_generated_phase_tables_match_registries():
    for fam, reg in load_all().items():
        spec = importlib.util.find_spec(f"profiler.generated.{fam}_phases")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        assert mod.REGISTRY_HASH == reg.hash
        assert mod.PHASES == reg.phase_names()
        assert mod.BARRIERS == reg.barrier_names()
        assert mod.REGISTRY == reg.to_json()
