"""profiler.store.validate: every manifest field the readers use is type-checked with one typed,
one-line error naming the field; nesting and size are bounded; bundled manifests pass."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from profiler.store import validate
from profiler.errors import CorruptRun, InvalidManifest, UnsupportedRunVersion

TRACES = Path(__file__).resolve().parents[2] / "traces"
GOOD = {"format": "epscope-run", "format_version": 1, "name": "x",
        "git": {"branch": "main", "commit": "abc", "dirty": False},
        "clock": {"source": "globaltimer", "step_ns": 32, "ranks": [{"rank": 0, "uncertainty_ns": float("inf")}]},
        "drops": {"total": 0, "per_rank": [0]}, "warnings": [{"type": "DroppedRecords", "count": 0, "detail": ""}]}


def test_a_good_manifest_passes():
    assert validate.manifest(dict(GOOD)) == GOOD


def test_every_bundled_manifest_passes():
    paths = sorted(TRACES.rglob("manifest.json"))
    assert paths, "traces/ is tracked in git: its manifests must be here"
    for p in paths:
        validate.manifest_file(p)


# (field, value): the examples first, then one of each kind of field
BAD_FIELDS = [
    ("git", "abc"), ("clock", [1, 2]), ("drops", {"total": "many"}),
    ("name", 5), ("description", ["a"]), ("status", {}), ("num_events", -1), ("num_events", 1.5),
    ("git", {"commit": 12}), ("git", {"dirty": "no"}), ("gpu", {"count": "two"}),
    ("clock", {"ranks": [{"rank": "a"}]}), ("clock", {"ranks": {"0": {}}}), ("clock", {"step_ns": "32"}),
    ("clock", {"host": {"uncertainty_ns": None, "slope": "1"}}), ("drops", {"per_rank": [0, "1"]}),
    ("warnings", "none"), ("warnings", [{"type": 3}]), ("warnings", [{"type": "X", "count": "3"}]),
    ("workload", "ep"), ("config", [1]), ("registry", {"ep": 1}), ("registry", {"ep": {"family": "no such"}}),
    ("expect", {"schema": 1, "cause": "gremlins"}), ("version_id", 7),
]


@pytest.mark.parametrize("field, value", BAD_FIELDS, ids=[f"{f}={v!r}"[:40] for f, v in BAD_FIELDS])
def test_a_wrong_field_type_is_one_typed_line(field, value):
    m = {**GOOD, field: value}
    with pytest.raises(InvalidManifest) as e:
        validate.manifest(m, "RUN/manifest.json")
    msg = str(e.value)
    assert msg.startswith("RUN/manifest.json: field '" + field) and "\n" not in msg
    assert e.value.field.startswith(field)
    assert isinstance(e.value, CorruptRun)


@pytest.mark.parametrize("v", [True, False, 0, -5, "1", 1.0, None])
def test_format_version_must_be_a_positive_integer(v):
    with pytest.raises(InvalidManifest, match="format_version"):
        validate.manifest({**GOOD, "format_version": v})


def test_newer_format_version_is_unsupported():
    with pytest.raises(UnsupportedRunVersion, match="newer"):
        validate.manifest({**GOOD, "format_version": validate.FORMAT_VERSION + 1})


def test_null_stands_for_absent():
    validate.manifest({**GOOD, "error": None, "git": None, "clock": {"host": None}})


def test_unknown_fields_are_allowed_but_nesting_is_bounded():
    validate.manifest({**GOOD, "future": {"a": [1, {"b": 2}]}})
    deep = {}
    cur = deep
    for _ in range(validate.MAX_DEPTH + 1):
        cur["x"] = {}
        cur = cur["x"]
    with pytest.raises(InvalidManifest, match="nested deeper"):
        validate.manifest({**GOOD, "config": deep})


def test_5000_deep_json_is_a_typed_error_not_a_recursion_error():
    text = json.dumps(GOOD)[:-1] + ', "x": ' + "[" * 5000 + "]" * 5000 + "}"
    with pytest.raises(InvalidManifest, match="nested deeper"):
        validate.manifest_text(text)


@pytest.mark.parametrize("text, words", [("{not json", "not valid JSON"), ("[1, 2]", "not a JSON object"),
                                         ('{"format": "other"}', "not an epscope-run manifest"),
                                         (b"\xff\xfe", "not valid JSON")])
def test_not_a_manifest(text, words):
    with pytest.raises(InvalidManifest, match=words):
        validate.manifest_text(text)


def test_size_is_bounded():
    with pytest.raises(InvalidManifest, match="more than a manifest may hold"):
        validate.manifest_text(" " * (validate.MAX_MANIFEST_BYTES + 1))
