"""`epscope tune` on the CPU: settings that fail at start, and the screen / rank / re-check logic on
synthetic rounds of known answer (a truly faster candidate is saved; noise, a lucky screening
round or a gain below the margin keep the incumbent, and the output says why)."""
import numpy as np
import pytest

from profiler.workflows import tune as T
from ep_core import tuned


def _args(*extra):
    return T.build_parser().parse_args(list(extra))


@pytest.mark.parametrize("args, env, msg", [
    (["--rounds", "1"], {}, "rounds must be >= 2"),
    (["--recheck-rounds", "1"], {}, "recheck rounds must be >= 2"),
    (["--margin", "2%"], {}, "--margin: '2%' is not a number"),
    (["--margin", "1.5"], {}, "margin must be a fraction in [0, 1)"),
    (["--margin", "nan"], {}, "margin must be a fraction"),
    (["--top", "0"], {}, "top must be >= 1"),
    ([], {"EPSCOPE_TUNE_MARGIN": ""}, "EPSCOPE_TUNE_MARGIN is set but empty"),
    ([], {"EPSCOPE_TUNE_ROUNDS": "three"}, "EPSCOPE_TUNE_ROUNDS: 'three' is not an integer"),
    ([], {"EPSCOPE_TUNE_ROUNDS": "1"}, "rounds must be >= 2"),
    ([], {"EPSCOPE_DISPATCH_SENDER_FRACTION": ""}, "EPSCOPE_DISPATCH_SENDER_FRACTION is set but empty"),
    ([], {"EPSCOPE_CHUNKS_PER_SENDER_BLOCK": "4"}, "is set (4): unset it"),
    (["--sms", "23"], {}, "candidate sms23-chunkdefault: Config.num_sms must be even"),
    (["--chunks", "300"], {}, "candidate sms24-chunk300"),
    (["--sms", "24,x"], {}, "--sms: 'x' is not an integer"),
    (["--sms", "24,24"], {}, "a value twice"),
    (["--iters", "2"], {}, "--iters must be >= 3"),
    (["--copy-paths", "fast"], {}, "'fast' is not 'direct' or 'tma:N'"),
    (["--copy-paths", "tma:"], {}, "needs a buffer count"),
    (["--copy-paths", "tma:5"], {}, "Config.num_tma_buffers must be in"),
    (["--hidden", "100"], {}, "Problem.hidden"),
])
def test_invalid_settings_fail_at_start(args, env, msg):
    with pytest.raises(T.TuneUsage, match=msg.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        T.check_settings(_args(*args), env=env)


def test_flags_win_over_the_environment_and_defaults_fill_the_rest():
    _, s, cands = T.check_settings(_args("--rounds", "5"), env={"EPSCOPE_TUNE_ROUNDS": "9",
                                                               "EPSCOPE_TUNE_MARGIN": "0.05"})
    assert (s.rounds, s.margin, s.top, s.recheck_rounds) == (5, 0.05, T.DEFAULTS["top"], T.DEFAULTS["recheck_rounds"])
    assert [c.name for c in cands][:4] == ["sms24-chunkdefault", "sms24-chunkdefault-tma2", "sms24-chunkdefault-tma3",
                                           "sms24-chunk48"] and len(cands) == 4 * 3 * 3
    tma = next(c for c in cands if c.name == "sms64-chunk96-tma2").configs(2)["dispatch"]
    assert (tma["num_sms"], tma["num_max_nvl_chunked_send_tokens"], tma["path"], tma["num_tma_buffers"]) == \
        (64, 96, "tma", 2)


def test_main_refuses_bad_settings_and_cpu_machines(capsys, monkeypatch):
    assert T.main(["--rounds", "1"]) == 2 and "rounds must be >= 2" in capsys.readouterr().err
    monkeypatch.setattr("profiler.workflows.ab.gpu_count", lambda: 0)
    monkeypatch.delenv("EPSCOPE_TUNE_ROUNDS", raising=False)
    assert T.main([]) == 2 and "it has 0" in capsys.readouterr().err
    assert T.main(["--dry-run"]) == 0 and "36 candidates x 3 rounds" in capsys.readouterr().out


# -- the logic, with a synthetic round runner -------------------------------------------------------
def runner(levels, *, sd=0.3, screening_only=None, run_sd=0.0, seed=0):
    """levels: {side: {kernel: µs}} (missing sides run at the incumbent's level). screening_only: a
    side that is fast in screening rounds only (a lucky draw the re-check must catch)."""
    rng = np.random.default_rng(seed)

    def run(name, rnd, configs):
        lv = dict(levels.get(name, levels[T.INCUMBENT]))
        if name == screening_only and rnd >= S.rounds:
            lv = dict(levels[T.INCUMBENT])
        shift = rng.normal(0, run_sd)
        return {m: list(rng.normal(lv.get(m, 100.0) + shift, sd, 10)) for m in ("dispatch", "combine", "op")}
    return run


S = T.Settings(rounds=3, recheck_rounds=4, top=2, margin=0.02, iters=10, warmup=0)
CANDS = [T.Candidate("fast-dispatch", 64, None), T.Candidate("same", 24, None), T.Candidate("slow", 24, 96)]
INC = CANDS[1].configs(2)
BASE = {"dispatch": 230.0, "combine": 285.0}


def test_a_faster_candidate_is_saved_and_the_incumbent_kept_where_nothing_wins():
    run = runner({T.INCUMBENT: BASE, "fast-dispatch": {"dispatch": 205.0, "combine": 285.0},
                  "slow": {"dispatch": 250.0, "combine": 300.0}})
    res = T.tune(CANDS, INC, S, run, 2, say=lambda m: None)
    d, c = res["dispatch"], res["combine"]
    assert d.winner == "fast-dispatch" and "beat the incumbent on re-check by" in d.why
    assert d.screened[0][0] == "fast-dispatch" and d.screened[-1][0] == "slow"
    assert c.winner == T.INCUMBENT and "no candidate was faster" in c.why


def test_a_lucky_screening_round_does_not_survive_the_recheck():
    run = runner({T.INCUMBENT: BASE, "fast-dispatch": {"dispatch": 205.0, "combine": 285.0}},
                 screening_only="fast-dispatch")
    res = T.tune(CANDS, INC, S, run, 2, say=lambda m: None)
    assert res["dispatch"].winner == T.INCUMBENT
    assert "no candidate beat the incumbent on re-check" in res["dispatch"].why and "fast-dispatch" in res["dispatch"].why


def test_the_margin_decides_and_is_stated():
    levels = {T.INCUMBENT: BASE, "fast-dispatch": {"dispatch": 227.0, "combine": 285.0}}   # 1.3 % faster
    res = T.tune(CANDS, INC, S, runner(levels), 2, say=lambda m: None)
    assert res["dispatch"].winner == T.INCUMBENT and "margin 2.0%" in res["dispatch"].why
    s0 = T.Settings(**{**S.__dict__, "margin": 0.0})
    assert T.tune(CANDS, INC, s0, runner(levels), 2, say=lambda m: None)["dispatch"].winner == "fast-dispatch"


def test_run_to_run_noise_larger_than_the_gain_keeps_the_incumbent():
    levels = {T.INCUMBENT: BASE, "fast-dispatch": {"dispatch": 226.0, "combine": 285.0}}
    res = T.tune(CANDS, INC, S, runner(levels, sd=0.1, run_sd=15.0, seed=4), 2, say=lambda m: None)
    assert res["dispatch"].winner == T.INCUMBENT


def test_entries_carry_latency_spread_samples_and_why(tmp_path):
    run = runner({T.INCUMBENT: BASE, "fast-dispatch": {"dispatch": 205.0, "combine": 285.0}})
    res = T.tune(CANDS, INC, S, run, 2, say=lambda m: None)
    configs = {c.name: c.configs(2) for c in CANDS} | {T.INCUMBENT: INC}

    def key_for(kernel):
        return tuned.TunedKey("NVIDIA H200", 2, "bf16", 7168, 4096)

    entries = T.entries_for(res, configs, key_for, S, "abc123", "epscope tune")
    d = next(e for e in entries if e.kernel == "dispatch")
    assert d.config == configs["fast-dispatch"]["dispatch"] and (d.tokens_min, d.tokens_max) == (2049, 4096)
    assert d.latency_us == pytest.approx(205.0, abs=1.0) and 0 < d.spread_us < 2.0
    assert (d.samples, d.runs) == (40, 4) and d.verdict["winner"] == "fast-dispatch" and not d.incumbent["kept"]
    c = next(e for e in entries if e.kernel == "combine")
    assert c.config == INC["combine"] and c.incumbent["kept"] and c.runs == S.rounds
    path = tuned.save_entries(tmp_path / "t.json", entries)
    m = tuned.lookup(tuned.load_table(path), "dispatch", key_for("dispatch"))
    assert m.entry == d and "matched dispatch NVIDIA H200" in m.reason


def test_incumbent_is_the_table_entry_or_the_recommended_table(tmp_path):
    from ep_core.config import DEFAULT_NUM_SMS, dispatch_config

    def key_for(kernel):
        return tuned.TunedKey("NVIDIA H200", 2, "bf16", 7168, 4096)

    configs, why = T.incumbent_configs(2, key_for, tmp_path / "none.json")
    assert configs["dispatch"] == dispatch_config(2, DEFAULT_NUM_SMS).to_dict() and "recommended table" in why["dispatch"]
    e = tuned.Entry("dispatch", "NVIDIA H200", 2, "bf16", 7168, 2049, 4096, dispatch_config(2, 48).to_dict(),
                    200.0, 2.0, 40, 4)
    p = tuned.save_entries(tmp_path / "t.json", [e])
    configs, why = T.incumbent_configs(2, key_for, p)
    assert configs["dispatch"]["num_sms"] == 48 and why["dispatch"].startswith("matched")
