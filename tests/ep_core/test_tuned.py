"""ep_core.tuned: the table format, buckets that never govern larger token counts, lookups that say
which entry matched and why, and Buffer's default config taken from it (overridable)."""
import json
import pytest

from ep_core import tuned
from ep_core.config import combine_config, dispatch_config

KEY = tuned.TunedKey("NVIDIA H200", 2, "bf16", 7168, 4096)


def _entry(kernel="dispatch", tokens=4096, num_sms=32, **kw):
    lo, hi = tuned.bucket(tokens)
    d = dict(kernel=kernel, gpu="NVIDIA H200", ranks=2, dtype="bf16", hidden=7168, tokens_min=lo, tokens_max=hi,
             config=dispatch_config(2, num_sms).to_dict(), latency_us=210.0, spread_us=3.0, samples=80, runs=4)
    d.update(kw)
    return tuned.Entry(**d)


def test_bucket_is_half_open_below_the_tuned_count():
    assert tuned.bucket(4096) == (2049, 4096)
    assert tuned.bucket(1) == (1, 1)
    with pytest.raises(tuned.TunedTableError):
        tuned.bucket(0)


def test_lookup_reports_the_entry_and_why():
    entries = [_entry(tokens=4096), _entry(tokens=512, num_sms=24), _entry("combine", tokens=4096)]
    m = tuned.lookup(entries, "dispatch", tuned.TunedKey("NVIDIA H200", 2, "bf16", 7168, 3000), "t.json")
    assert m.entry is entries[0] and m.table == "t.json"
    assert "3000 tokens in 2049..4096" in m.reason and "tuned at 4096" in m.reason
    m = tuned.lookup(entries, "dispatch", tuned.TunedKey("NVIDIA H200", 2, "bf16", 7168, 300))
    assert m.entry is entries[1]


def test_a_rule_for_fewer_tokens_never_governs_more():
    m = tuned.lookup([_entry(tokens=4096)], "dispatch", tuned.TunedKey("NVIDIA H200", 2, "bf16", 7168, 8192))
    assert m.entry is None and "above every tuned dispatch bucket (2049..4096)" in m.reason
    assert "does not govern more" in m.reason
    m = tuned.lookup([_entry(tokens=4096)], "dispatch", tuned.TunedKey("NVIDIA H200", 2, "bf16", 7168, 1000))
    assert m.entry is None and "falls in no tuned dispatch bucket" in m.reason


@pytest.mark.parametrize("field, value", [("gpu", "NVIDIA H100"), ("ranks", 4), ("dtype", "fp8"), ("hidden", 4096)])
def test_another_shape_does_not_match(field, value):
    key = tuned.TunedKey(**{**KEY.__dict__, field: value})
    m = tuned.lookup([_entry()], "dispatch", key)
    assert m.entry is None and m.reason.startswith("no tuned dispatch entry for")


def test_save_merges_and_replaces_the_same_bucket(tmp_path):
    p = tmp_path / "t.json"
    tuned.save_entries(p, [_entry(tokens=4096, num_sms=32), _entry("combine")])
    tuned.save_entries(p, [_entry(tokens=4096, num_sms=64), _entry(tokens=1024)])
    got = tuned.load_table(p)
    d = [e for e in got if e.kernel == "dispatch"]
    assert sorted(e.tokens_max for e in d) == [1024, 4096]
    assert next(e for e in d if e.tokens_max == 4096).config["num_sms"] == 64 and len(got) == 3


@pytest.mark.parametrize("mutate, msg", [
    (lambda d: d.update(format="x"), "not an epscope-tuned table"),
    (lambda d: d.update(format_version=99), "newer"),
    (lambda d: d["entries"][0].update(ranks="2"), "entries[0].ranks"),
    (lambda d: d["entries"][0].update(kernel="notify"), "entries[0].kernel"),
    (lambda d: d["entries"][0].update(tokens_min=5000), "is empty"),
    (lambda d: d["entries"][0]["config"].update(num_sms=23), "entries[0].config"),
    (lambda d: d["entries"][0].update(colour="red"), "unknown fields"),
])
def test_a_broken_table_names_the_field(tmp_path, mutate, msg):
    p = tuned.save_entries(tmp_path / "t.json", [_entry()])
    d = json.loads(p.read_text())
    mutate(d)
    p.write_text(json.dumps(d))
    with pytest.raises(tuned.TunedTableError, match=msg.replace("[", r"\[").replace("]", r"\]")):
        tuned.load_table(p)


def test_table_path_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(tuned.ENV, "off")
    assert tuned.table_path() is None
    monkeypatch.setenv(tuned.ENV, " ")
    with pytest.raises(tuned.TunedTableError, match="set but empty"):
        tuned.table_path()
    monkeypatch.setenv(tuned.ENV, str(tmp_path / "missing.json"))
    with pytest.raises(tuned.TunedTableError, match="no such file"):
        tuned.table_path()


# -- Buffer's default config (the method, on a stand-in Buffer: no GPU needed) -------------------
def _fake_buffer(monkeypatch):
    import torch

    from ep_core import buffer as B

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    monkeypatch.setattr(B.Buffer, "_num_sms_set", False)

    class StandIn:   # the attributes Buffer's default-config methods use, without a GPU buffer
        group_size, device = 2, None
        get_dispatch_config = staticmethod(B.Buffer.get_dispatch_config)
        get_combine_config = staticmethod(B.Buffer.get_combine_config)
        _default_config = B.Buffer._default_config
        _tuned_config = B.Buffer._tuned_config

        def __init__(self):
            self._default_configs = {}

    return B, StandIn()


def test_buffer_uses_a_matching_entry_and_says_so(tmp_path, monkeypatch, capsys):
    B, buf = _fake_buffer(monkeypatch)
    p = tuned.save_entries(tmp_path / "t.json", [_entry(num_sms=48)])
    monkeypatch.setenv(tuned.ENV, str(p))
    monkeypatch.setattr(tuned, "_announced", set())
    cfg = B.Buffer._default_config(buf, "dispatch", 4096, 7168, "bf16")
    assert cfg == dispatch_config(2, 48)
    err = capsys.readouterr().err
    assert "ep_core: dispatch uses the tuned config" in err and "4096 tokens in 2049..4096" in err
    B.Buffer._default_config(buf, "dispatch", 3000, 7168, "bf16")
    assert capsys.readouterr().err == ""        # said once per entry
    # no entry for 8192 tokens, none for combine: the recommended tables, silently
    assert B.Buffer._default_config(buf, "dispatch", 8192, 7168, "bf16") == dispatch_config(2, B.Buffer.num_sms)
    assert B.Buffer._default_config(buf, "combine", 4096, 7168, "bf16") == combine_config(2, B.Buffer.num_sms)
    # one Config object per key: cached plans key on its identity
    assert buf._default_config("dispatch", 4096, 7168, "bf16") is buf._default_config("dispatch", 4096, 7168, "bf16")


def test_buffer_default_is_overridable(tmp_path, monkeypatch):
    B, buf = _fake_buffer(monkeypatch)
    p = tuned.save_entries(tmp_path / "t.json", [_entry(num_sms=48)])
    monkeypatch.setenv(tuned.ENV, "off")
    assert B.Buffer._default_config(buf, "dispatch", 4096, 7168, "bf16") == dispatch_config(2, B.Buffer.num_sms)
    monkeypatch.setenv(tuned.ENV, str(p))
    buf = _fake_buffer(monkeypatch)[1]
    monkeypatch.setattr(B.Buffer, "_num_sms_set", True)     # Buffer.set_num_sms was called: the caller chose
    assert B.Buffer._default_config(buf, "dispatch", 4096, 7168, "bf16") == dispatch_config(2, B.Buffer.num_sms)


def test_set_num_sms_marks_the_choice(monkeypatch):
    from ep_core import buffer as B

    monkeypatch.setattr(B.Buffer, "num_sms", 20)
    monkeypatch.setattr(B.Buffer, "_num_sms_set", False)
    B.Buffer.set_num_sms(24)
    assert B.Buffer._num_sms_set and B.Buffer.num_sms == 24
