"""profiler.registry.codegen: the generated headers and tables match their sources, and drift is caught."""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from profiler.registry import codegen
from profiler.generated import layout as L
from profiler.registry.registry import load_all, registry_files


def test_checkout_generated_files_are_fresh():
    assert codegen.main(["--check"]) == 0, "run `python -m profiler.registry.codegen` and commit the result"


@pytest.fixture
def gen_dirs(tmp_path, monkeypatch):
    """A temporary tree: the profiler's generated dirs, and every registry of the checkout copied
    into `<tmp>/<its package>/phases/`, so generating writes nothing into the checkout."""
    cuh, py = tmp_path / "profiler" / "csrc" / "generated", tmp_path / "profiler" / "generated"
    monkeypatch.setattr(codegen, "CUH_DIR", cuh)
    monkeypatch.setattr(codegen, "PY_DIR", py)
    # ROOT.parent is used to print relative paths; keep it a parent of the temp dirs
    monkeypatch.setattr(codegen, "ROOT", tmp_path / "profiler")
    copies = []
    for src in registry_files():
        dst = tmp_path / src.parent.parent.name / "phases" / src.name
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_text(src.read_text())
        copies.append(dst)
    monkeypatch.setattr(codegen, "registry_files", lambda: sorted(copies))
    return cuh, py, tmp_path


def test_regenerate_into_temp_then_check_round_trip(gen_dirs):
    cuh, py, root = gen_dirs
    assert codegen.main([]) == 0
    assert codegen.stale_files() == []
    assert codegen.main(["--check"]) == 0
    # the temp copy is byte-identical to the committed one, wherever each family's files live
    for reg in registry_files():
        tmp_cuh, tmp_py = codegen.outputs_for(root / reg.parent.parent.name / "phases" / reg.name)
        real_cuh, real_py = codegen.outputs_for(reg)
        assert tmp_py.read_text() == real_py.read_text()
        assert tmp_cuh.read_text() == real_cuh.read_text()
    assert (py / "layout.py").read_text() == (codegen.Path(codegen.__file__).parents[1] / "generated" / "layout.py").read_text()


def test_each_family_is_generated_next_to_its_registry(gen_dirs):
    _, _, root = gen_dirs
    codegen.main([])
    for reg in registry_files():
        pkg = root / reg.parent.parent.name
        assert (pkg / "generated" / f"{reg.stem}_phases.py").is_file()
        assert (pkg / "csrc" / "generated" / f"{reg.stem}_phases.cuh").is_file()
        assert (pkg / "generated" / "__init__.py").is_file()


def test_explicit_registry_paths_generate_only_those(gen_dirs):
    cuh, py, root = gen_dirs
    one = next(p for p in codegen.registry_files() if p.parent.parent.name != "profiler")
    assert codegen.main([str(one)]) == 0
    out_cuh, out_py = codegen.outputs_for(one)
    assert out_cuh.is_file() and out_py.is_file()
    assert not list(py.glob("*_phases.py")), "a partial list generated the profiler's own families"
    assert codegen.main(["--check", str(one)]) == 0


def test_registry_outside_a_phases_dir_is_refused(tmp_path):
    p = tmp_path / "fam.toml"
    p.write_text("family = 'fam'\n")
    with pytest.raises(ValueError, match="phases/"):
        codegen.outputs_for(p)


def test_check_fails_on_edited_and_orphan_files(gen_dirs, capsys):
    cuh, py, root = gen_dirs
    codegen.main([])
    (cuh / "layout.cuh").write_text((cuh / "layout.cuh").read_text() + "// hand edit\n")
    (py / "old_family_phases.py").write_text("FAMILY = 'old'\n")
    other = next(p for p in codegen.registry_files() if p.parent.parent.name != "profiler")
    orphan = other.parent.parent / "generated" / "gone_phases.py"
    orphan.write_text("FAMILY = 'gone'\n")
    bad = {p.name for p in codegen.stale_files()}
    assert bad == {"layout.cuh", "old_family_phases.py", "gone_phases.py"}
    assert codegen.main(["--check"]) == 1
    assert "stale:" in capsys.readouterr().err
    assert codegen.main([]) == 0 and not orphan.exists()


def test_generated_dtypes_follow_declared_sizes_and_offsets():
    lay = codegen.load_layout()
    dtypes = {"BufferHeader": L.BUFFERHEADER_DTYPE, "RegionHeader": L.REGIONHEADER_DTYPE, "Record": L.RECORD_DTYPE,
              "Record8": L.RECORD8_DTYPE}
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
    assert 'static_assert(sizeof(Record8) == 8' in text and "offsetof(Record8, meta)" in text


def test_record8_meta_fields_tile_the_word_and_hold_every_kind(tmp_path, monkeypatch):
    lay = codegen.load_layout()
    fields = codegen.meta_fields(lay)
    assert sum(w for _, _, w in fields) == 32 and fields[0][1] == 0
    assert all(a[1] + a[2] == b[1] for a, b in zip(fields, fields[1:]))
    assert (L.META_KIND_SHIFT, L.META_ID_SHIFT, L.META_PAYLOAD_BITS) == (lay["record8"]["kind"][0], lay["record8"]["id"][0],
                                                                        lay["record8"]["payload"][1])
    bad = codegen.LAYOUT_TOML.read_text().replace("kind = [28, 4]", "kind = [29, 3]", 1)
    p = tmp_path / "layout.toml"
    p.write_text(bad)
    monkeypatch.setattr(codegen, "LAYOUT_TOML", p)
    with pytest.raises(ValueError, match=r"\[record8\]"):
        codegen.load_layout()


def test_phase_headers_say_which_payloads_are_wide():
    """payload_wide() of each generated header is true exactly for the registry's 32-bit payloads."""
    files = {p.stem: p for p in registry_files()}

    def const(prefix, name):
        return prefix + "".join(w.capitalize() for w in name.split("_"))
    for fam, reg in load_all().items():
        text = codegen.outputs_for(files[fam])[0].read_text()
        for enum, items, prefix in (("Phase", reg.phases, "k"), ("Barrier", reg.barriers, "kBarrier")):
            line = next(x for x in text.splitlines() if f"payload_wide({enum} x)" in x)
            for i in items:
                assert (f"x == {const(prefix, i.name)}" in line) == (i.payload_bits == 32), (fam, i.name, line)


def test_layout_rejects_padding(tmp_path, monkeypatch):
    bad = codegen.LAYOUT_TOML.read_text().replace('["id", "u16"', '["id", "u8"', 1)
    p = tmp_path / "layout.toml"
    p.write_text(bad)
    monkeypatch.setattr(codegen, "LAYOUT_TOML", p)
    with pytest.raises(ValueError, match="Record"):
        codegen.load_layout()


def test_generated_phase_tables_match_registries():
    files = {p.stem: p for p in registry_files()}
    for fam, reg in load_all().items():
        _, py = codegen.outputs_for(files[fam])
        spec = importlib.util.spec_from_file_location(f"_gen_{fam}", py)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        assert mod.REGISTRY_HASH == reg.hash
        assert mod.PHASES == reg.phase_names()
        assert mod.BARRIERS == reg.barrier_names()
        assert mod.REGISTRY == reg.to_json()
