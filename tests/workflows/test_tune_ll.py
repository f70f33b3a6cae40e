"""`epscope tune --ll` on the CPU: settings and candidates refused at start with the flag named, and
the screen / rank / re-check logic on the low-latency kernels with synthetic rounds of known answer
(per kernel winners, a lucky screening round caught, the incumbent kept where nothing wins), the
entries it writes (kernel, GPU, ranks, dtype, hidden, T_max bucket, latency, spread, samples) and
their lookup."""
import numpy as np
import pytest

from profiler.workflows import tune as T
from profiler.workflows import tune_ll as L
from ep_core import tuned
from ep_core.low_latency import LowLatencyConfig


def _args(*extra):
    return T.build_parser().parse_args(["--ll", *extra])


@pytest.mark.parametrize("args, env, msg", [
    (["--sms", "24"], {}, "--sms: the normal kernels only"),
    (["--tokens", "128", "--chunks", "48"], {}, "--tokens, --chunks: the normal kernels only"),
    (["--buckets", "64,16"], {}, "--buckets: low-latency bucket tops must increase"),
    (["--buckets", "2048"], {}, "--buckets: .*1..1024"),
    (["--buckets", "16,x"], {}, "--buckets: 'x' is not an integer"),
    (["--blocks", "1"], {}, "candidate b1-w8: .*num_blocks \\(1\\) must be >= the rank count"),
    (["--blocks", "300"], {}, "candidate b300-w8: LowLatencyConfig.num_blocks must be in 1..256"),
    (["--warps", "32"], {}, "candidate b32-w32: LowLatencyConfig.warps_per_block must be in 1..16"),
    (["--blocks", "64,64"], {}, "--blocks lists a value twice"),
    (["--knobs", "host=per_call"], {}, "'host' changes the host's per-call work"),
    (["--knobs", "colour=red"], {}, "no knob 'colour'"),
    (["--knobs", "min_slice_groups=x"], {}, "min_slice_groups='x' is not an integer"),
    (["--knobs", "min_slice_groups"], {}, "is not 'knob=value"),
    (["--knobs", "split=diagonal"], {}, "candidate split-diagonal: LowLatencyConfig.split must be one of"),
    (["--knobs", "loads=first;loads=in_order"], {}, "loads given twice"),
    (["--rounds", "1"], {}, "rounds must be >= 2"),
    ([], {"EPSCOPE_TUNE_MARGIN": ""}, "EPSCOPE_TUNE_MARGIN is set but empty"),
    (["--margin", "5%"], {}, "--margin: '5%' is not a number"),
    (["--ranks", "1"], {}, "--ranks must be >= 2"),
    (["--hidden", "100"], {}, "LowLatencyLayout.hidden must be a positive multiple of 128"),
    (["--topk", "17"], {}, "--topk must be in 1..16"),
])
def test_invalid_settings_fail_at_start(args, env, msg):
    with pytest.raises(T.TuneUsage, match=msg):
        L.check_settings(_args(*args), env=env)


def test_low_latency_flags_need_ll():
    with pytest.raises(T.TuneUsage, match="--blocks, --knobs: the low-latency kernels \\(--ll\\) only"):
        T.check_settings(T.build_parser().parse_args(["--blocks", "32", "--knobs", "loads=first"]), env={})


def test_the_default_sweep_and_why_each_candidate():
    shape, s, buckets, cands = L.check_settings(_args(), env={"EPSCOPE_DISPATCH_SENDER_FRACTION": "0.5"})
    # (a normal-kernel geometry override does not shape the low-latency kernels: not refused here)
    assert (shape.ranks, shape.hidden, shape.topk, shape.experts, shape.dtype) == (2, 7168, 8, 256, "fp8")
    assert shape.dtype_of("ll_dispatch") == "fp8" and shape.dtype_of("ll_combine") == "bf16"
    assert buckets == [(1, 16), (17, 64), (65, 128), (129, 256)]
    names = [c.name for c in cands]
    assert names == ["defaults", "b32-w8", "b32-w16", "b64-w8", "b96-w8", "b96-w16", "b128-w8", "b128-w16",
                     "min_slice_groups-2", "min_slice_groups-8"]
    by = {c.name: c.config for c in cands}
    assert by["defaults"] == LowLatencyConfig()
    assert by["min_slice_groups-8"] == LowLatencyConfig(min_slice_groups=8)      # at the default grid
    assert by["b96-w8"] == LowLatencyConfig(num_blocks=96, warps_per_block=8)   # at the default knobs
    # the incumbent (the defaults, no table entry) is not run against itself
    inc = {k: LowLatencyConfig().to_dict() for k in tuned.LL_KERNELS}
    assert [c.name for c in L.for_bucket(cands, inc)] == names[1:]
    inc["ll_combine"] = by["b96-w8"].to_dict()   # a tuned combine: the defaults run again (for the dispatch)
    assert "defaults" in [c.name for c in L.for_bucket(cands, inc)]


def test_old_behaviours_can_be_swept_on_request():
    _, _, _, cands = L.check_settings(_args("--blocks", "64", "--warps", "16", "--knobs",
                                            "split=per_block;barrier=all;loads=in_order"), env={})
    assert [c.name for c in cands] == ["defaults", "split-per_block", "barrier-all", "loads-in_order"]
    assert cands[1].config == LowLatencyConfig(split="per_block")


def test_main_refuses_bad_settings_and_cpu_machines(capsys, monkeypatch):
    assert T.main(["--ll", "--knobs", "host=cached"]) == 2 and "'host'" in capsys.readouterr().err
    monkeypatch.setattr("profiler.workflows.ab.gpu_count", lambda: 0)
    monkeypatch.delenv("EPSCOPE_TUNE_ROUNDS", raising=False)
    assert T.main(["--ll"]) == 2 and "it has 0" in capsys.readouterr().err
    assert T.main(["--ll", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "10 candidates" in out and "1..16, 17..64, 65..128, 129..256" in out and "b128-w16" in out


# -- the logic on the low-latency kernels, with a synthetic round runner ----------------------------
S = T.Settings(rounds=3, recheck_rounds=4, top=2, margin=0.02, iters=20, warmup=0)
CANDS = [L.LLCandidate("b128-w16", LowLatencyConfig(num_blocks=128)),
         L.LLCandidate("min_slice_groups-2", LowLatencyConfig(min_slice_groups=2)),
         L.LLCandidate("b32-w8", LowLatencyConfig(num_blocks=32, warps_per_block=8))]
INC = {k: LowLatencyConfig().to_dict() for k in tuned.LL_KERNELS}
BASE = {"ll_dispatch": 23.0, "ll_combine": 17.0}


def runner(levels, *, sd=0.4, screening_only=None, seed=0):
    rng = np.random.default_rng(seed)

    def run(name, rnd, configs):
        assert set(configs) == set(tuned.LL_KERNELS)
        lv = levels.get(name, levels[T.INCUMBENT])
        if name == screening_only and rnd >= S.rounds:
            lv = levels[T.INCUMBENT]
        return {m: list(rng.normal(lv.get(m, 40.0), sd, S.iters)) for m in ("ll_dispatch", "ll_combine", "ll_op")}
    return run


def _tune(run):
    return T.tune(CANDS, INC, S, run, 2, say=lambda m: None, kernels=tuned.LL_KERNELS)


def test_each_kernel_gets_its_own_winner():
    run = runner({T.INCUMBENT: BASE, "b128-w16": {"ll_dispatch": 19.0, "ll_combine": 17.0},
                  "min_slice_groups-2": {"ll_dispatch": 23.0, "ll_combine": 15.0},
                  "b32-w8": {"ll_dispatch": 30.0, "ll_combine": 25.0}})
    res = _tune(run)
    assert set(res) == set(tuned.LL_KERNELS)
    d, c = res["ll_dispatch"], res["ll_combine"]
    assert d.winner == "b128-w16" and "beat the incumbent on re-check by" in d.why
    assert c.winner == "min_slice_groups-2"
    assert d.screened[-1][0] == "b32-w8" and d.screened[-1][1].verdict == "slower"


def test_a_lucky_screening_round_and_a_gain_below_the_margin_keep_the_incumbent():
    run = runner({T.INCUMBENT: BASE, "b128-w16": {"ll_dispatch": 19.0, "ll_combine": 16.8}},
                 screening_only="b128-w16")
    res = _tune(run)
    assert res["ll_dispatch"].winner == T.INCUMBENT
    assert "no candidate beat the incumbent on re-check" in res["ll_dispatch"].why
    # 16.8 vs 17.0 µs is 1.2 %: below the 2 % margin however clear (the rounds are tight)
    assert res["ll_combine"].winner == T.INCUMBENT


def test_entries_are_keyed_per_kernel_dtype_and_t_max_bucket(tmp_path):
    run = runner({T.INCUMBENT: BASE, "b128-w16": {"ll_dispatch": 19.0, "ll_combine": 17.0}})
    res = _tune(run)
    configs = {c.name: c.configs(2) for c in CANDS} | {T.INCUMBENT: INC}
    shape = L.LLShape(2, 7168, 8, 256, "fp8", 0)

    def key_for(kernel):
        return tuned.TunedKey("NVIDIA H200", 2, shape.dtype_of(kernel), 7168, 64)

    entries = T.entries_for(res, configs, key_for, S, "abc123", "epscope tune --ll", tokens_range=(17, 64),
                            about={"t_max": 64, "experts": 256, "topk": 8})
    d = next(e for e in entries if e.kernel == "ll_dispatch")
    c = next(e for e in entries if e.kernel == "ll_combine")
    assert (d.gpu, d.ranks, d.dtype, d.hidden, d.tokens_min, d.tokens_max) == ("NVIDIA H200", 2, "fp8", 7168, 17, 64)
    assert (c.dtype, c.tokens_min, c.tokens_max) == ("bf16", 17, 64)
    assert d.config == LowLatencyConfig(num_blocks=128).to_dict() and not d.incumbent["kept"]
    assert d.latency_us == pytest.approx(19.0, abs=0.5) and 0 < d.spread_us < 2.0
    assert (d.samples, d.runs) == (4 * S.iters, 4) and d.tune["t_max"] == 64 and d.tune["command"]
    assert c.config == INC["ll_combine"] and c.incumbent["kept"] and c.runs == S.rounds
    p = tuned.save_entries(tmp_path / "t.json", entries)
    table = tuned.load_table(p)
    m = tuned.lookup(table, "ll_dispatch", tuned.TunedKey("NVIDIA H200", 2, "fp8", 7168, 40))
    assert m.entry == d and "T_max 40 in 17..64" in m.reason
    assert tuned.lookup(table, "ll_dispatch", tuned.TunedKey("NVIDIA H200", 2, "fp8", 7168, 65)).entry is None
    assert tuned.lookup(table, "ll_dispatch", tuned.TunedKey("NVIDIA H200", 2, "fp8", 7168, 16)).entry is None


def test_incumbent_is_the_table_entry_or_the_defaults(tmp_path):
    def key_for(kernel):
        return tuned.TunedKey("NVIDIA H200", 2, "fp8" if kernel == "ll_dispatch" else "bf16", 7168, 64)

    configs, why = L.incumbent_configs(key_for, tmp_path / "none.json")
    assert configs == INC and "LowLatencyConfig() defaults" in why["ll_dispatch"]
    e = tuned.Entry("ll_dispatch", "NVIDIA H200", 2, "fp8", 7168, 17, 64, LowLatencyConfig(num_blocks=96).to_dict(),
                    20.0, 1.0, 80, 4)
    p = tuned.save_entries(tmp_path / "t.json", [e])
    configs, why = L.incumbent_configs(key_for, p)
    assert configs["ll_dispatch"]["num_blocks"] == 96 and why["ll_dispatch"].startswith("matched ll_dispatch")
    assert configs["ll_combine"] == INC["ll_combine"]


# -- the command end to end, on stand-in workers ------------------------------------------------------
class StandInWorkers:
    """What `epscope tune --ll` asks of profiler.workflows.rounds.WorkerSet, answered from known levels: a
    128-block grid makes the dispatch faster at T_max 256 only; the 32-block grid's results differ
    on rank 1 (a wrong candidate must be dropped before it is ranked)."""

    asked: list = []

    def __init__(self, side, tree, ranks, inputs, log_dir, env=None, profile=True):
        assert env == {"EPSCOPE_TUNED_TABLE": "off"} and not profile
        self.rng = np.random.default_rng(1)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def start(self, timeout_s=0):
        return [{"ok": True, "rank": r, "gpu": "NVIDIA H200"} for r in range(2)]

    def request(self, cmd, timeout_s=0):
        StandInWorkers.asked.append(cmd)
        if cmd["cmd"] == "ll_check":
            assert cmd["reference"] == LowLatencyConfig().to_dict()
            return [{"ok": True, "rank": r, "differ": {n: f"rank {r}: recv_x differ" for n, c in cmd["configs"].items()
                                                       if r == 1 and c["num_blocks"] == 32}} for r in range(2)]
        assert cmd["cmd"] == "ll_round" and "b32-w16" not in str(cmd)
        fast = cmd["tokens"] == 256 and cmd["configs"]["ll_dispatch"]["num_blocks"] == 128
        d, c = (40.0 if fast else 46.0), 41.0
        return [{"ok": True, "rank": r, "samples": {"ll_dispatch": list(self.rng.normal(d, 0.3, cmd["iters"])),
                                                    "ll_combine": list(self.rng.normal(c, 0.3, cmd["iters"])),
                                                    "ll_op": [d + c] * cmd["iters"]}} for r in range(2)]


def test_the_command_drops_a_wrong_candidate_and_saves_each_bucket(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("profiler.workflows.ab.gpu_count", lambda: 2)
    monkeypatch.setattr("profiler.workflows.rounds.WorkerSet", StandInWorkers)
    for var in T.ENV_SETTINGS.values():
        monkeypatch.delenv(var, raising=False)
    table = tmp_path / "t.json"
    argv = ["--ll", "--buckets", "16,256", "--blocks", "32,128", "--warps", "16", "--knobs", "", "--rounds", "2",
            "--recheck-rounds", "3", "--iters", "10", "--table", str(table)]
    assert T.main(argv) == 0
    out = capsys.readouterr().out
    assert "dropped b32-w16: its results differ from the incumbent's (rank 1: recv_x differ)" in out
    entries = {(e.kernel, e.tokens_max): e for e in tuned.load_table(table)}
    assert sorted(entries) == [("ll_combine", 16), ("ll_combine", 256), ("ll_dispatch", 16), ("ll_dispatch", 256)]
    won = entries[("ll_dispatch", 256)]
    assert won.config["num_blocks"] == 128 and won.verdict["winner"] == "b128-w16" and won.tokens_min == 17
    assert won.tune["dropped"] == {"b32-w16": ["rank 1: recv_x differ"]} and won.tune["t_max"] == 256
    for key in (("ll_dispatch", 16), ("ll_combine", 16), ("ll_combine", 256)):
        assert entries[key].incumbent["kept"] and entries[key].config == LowLatencyConfig().to_dict(), key
    assert entries[("ll_dispatch", 16)].dtype == "fp8" and entries[("ll_combine", 16)].dtype == "bf16"
    # every round ran at its bucket's top, with both kernels' configs
    rounds = [c for c in StandInWorkers.asked if c["cmd"] == "ll_round"]
    assert {c["tokens"] for c in rounds} == {16, 256} and all(set(c["configs"]) == set(tuned.LL_KERNELS)
                                                               for c in rounds)
