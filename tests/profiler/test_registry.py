"""profiler.registry.registry: validation names the family and field; JSON round trip keeps the hash."""
from __future__ import annotations

import copy

import pytest

from profiler.registry import registry as registry_mod
from profiler.registry.registry import Registry, RegistryError, find_registry, load_all, registry_dirs

BASE = {
    "family": "fam",
    "version": 1,
    "roles": ["sender", "receiver"],
    "phases": [
        {"name": "send", "id": 1, "role": "sender"},
        {"name": "wait", "id": 2, "role": "sender", "parent": "send", "wait": True, "waits_for": "pub"},
        {"name": "pub", "id": 3, "role": "receiver", "kind": "instant"},
    ],
    "barriers": [{"name": "grid", "id": 1, "scope": "grid"}],
}


def mutate(fn):
    d = copy.deepcopy(BASE)
    fn(d)
    return d


def test_base_is_valid_and_round_trips():
    reg = Registry.from_dict(BASE)
    again = Registry.from_dict(reg.to_json())
    assert again == reg and again.hash == reg.hash
    assert reg.phase_names() == {1: "send", 2: "wait", 3: "pub"}
    assert reg.phase("wait").parent == "send"


def test_hash_changes_with_content():
    a = Registry.from_dict(BASE)
    b = Registry.from_dict(mutate(lambda d: d["phases"][0].update(doc="x")))
    assert a.hash != b.hash


@pytest.mark.parametrize("fn, match", [
    (lambda d: d.update(family="not an id"), "family"),
    (lambda d: d["phases"].append({"name": "send", "id": 9}), "duplicate phase name"),
    (lambda d: d["phases"].append({"name": "other", "id": 1}), "duplicate phase id"),
    (lambda d: d["phases"].append({"name": "zero", "id": 0}), "id 0 outside"),
    (lambda d: d["phases"].append({"name": "big", "id": 70000}), "outside 1..65535"),
    (lambda d: d["phases"].append({"name": "x", "id": 9, "role": "nobody"}), "role 'nobody' is not declared"),
    (lambda d: d["phases"].append({"name": "x", "id": 9, "parent": "ghost"}), "parent 'ghost' is not a phase"),
    (lambda d: d["phases"].append({"name": "x", "id": 9, "kind": "counter"}), "kind 'counter'"),
    (lambda d: d["phases"].append({"name": "x", "id": 9, "waits_for": "send"}), "waits_for needs wait"),
    (lambda d: d["phases"].append({"name": "x", "id": 9, "parent": "x"}), "nest in itself"),
    (lambda d: d["phases"].append({"name": "x", "id": 9, "colour": "red"}), "phase 'x'"),
    (lambda d: d["phases"].append({"name": "bad-name", "id": 9}), "not an identifier"),
    (lambda d: d["barriers"].append({"name": "b", "id": 2, "scope": "world"}), "scope 'world'"),
    (lambda d: d["barriers"].append({"name": "grid", "id": 2}), "duplicate barrier name"),
])
def test_validation_errors_name_the_problem(fn, match):
    with pytest.raises(RegistryError, match=match) as e:
        Registry.from_dict(mutate(fn))
    if "family" not in match:
        assert "registry fam" in str(e.value)


def test_parent_cycle_is_rejected():
    d = mutate(lambda d: d["phases"].extend([{"name": "a", "id": 7, "parent": "b"}, {"name": "b", "id": 8, "parent": "a"}]))
    with pytest.raises(RegistryError, match="cycle"):
        Registry.from_dict(d)


def test_checkout_registries_load_and_match_file_names():
    regs = load_all()
    assert {"selftest", "ep_intranode"} <= set(regs)
    for fam, reg in regs.items():
        assert reg.family == fam
        assert Registry.from_dict(reg.to_json()).hash == reg.hash


def test_registries_live_next_to_their_kernels():
    """The profiler keeps only its own family; ep_core's registries are in ep_core/phases/, found
    through the project's [tool.epscope] registry_dirs."""
    assert find_registry("selftest").parent == registry_mod.PHASES_DIR.resolve()
    ep = find_registry("ep_intranode")
    assert ep.parent.name == "phases" and ep.parent.parent.name == "ep_core"
    assert not (registry_mod.PHASES_DIR / "ep_intranode.toml").exists()
    assert registry_dirs()[0] == registry_mod.PHASES_DIR.resolve()


def test_env_path_adds_registry_dirs(tmp_path, monkeypatch):
    d = tmp_path / "mykernels" / "phases"
    d.mkdir(parents=True)
    (d / "mine.toml").write_text('family = "mine"\n[[phase]]\nname = "work"\nid = 1\n')
    monkeypatch.setenv(registry_mod.REGISTRY_PATH_ENV, str(d))
    assert d.resolve() in registry_dirs()
    assert find_registry("mine") == d.resolve() / "mine.toml"
    assert "mine" in load_all()


def test_unknown_family_names_the_search_path():
    with pytest.raises(RegistryError, match="no registry for kernel family 'nope'"):
        find_registry("nope")


def test_project_registry_dirs_must_be_a_list(tmp_path):
    p = tmp_path / "pyproject.toml"
    p.write_text('[tool.epscope]\nregistry_dirs = "ep_core/phases"\n')
    with pytest.raises(RegistryError, match="registry_dirs must be a list"):
        registry_mod._project_dirs(p)
