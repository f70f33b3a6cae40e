"""ep_core.low_latency_reference against a token-by-token loop written from the contract
(ep-api.md, DeepEP's low-latency semantics), on small random shapes: -1 entries, a rank with no
tokens, every token to one expert, a repeated expert in one token, FP8 / BF16, round_scale, UE8M0."""
from __future__ import annotations

import pytest
import torch

from ep_core import low_latency_reference as ref
from ep_core.reference import calc_diff


def _inputs(R, T, H, K, E, seed, drop=0.0, zero_rank=None, hot_expert=None, repeat=False):
    xs, topks, ws = [], [], []
    for r in range(R):
        g = torch.Generator().manual_seed(seed * 100 + r)
        n = 0 if r == zero_rank else T - r  # ranks bring different token counts
        x = torch.randn((n, H), generator=g).to(torch.bfloat16)
        scores = torch.rand((n, E), generator=g)
        idx = torch.topk(scores, K, dim=1).indices.to(torch.int64)
        if hot_expert is not None:
            idx[:, 0] = hot_expert
            idx[:, 1:] = torch.where(idx[:, 1:] == hot_expert, (hot_expert + 1) % E, idx[:, 1:])
        if drop:
            idx[torch.rand((n, K), generator=g) < drop] = -1
        if repeat and n:
            idx[0, 1] = idx[0, 0]  # the same expert twice in one token
        w = torch.rand((n, K), generator=g) + 0.1
        xs.append(x)
        topks.append(idx)
        ws.append(w)
    return xs, topks, ws


def _brute(xs, topks, E, T_max, use_fp8, round_scale):
    """Per rank: {local expert: [(source, token, row payload, scale_inv or None)]} in contract order."""
    R = len(xs)
    El = E // R
    out = []
    for j in range(R):
        per_e = {e: [] for e in range(El)}
        for si in range(R):
            s = (j + si) % R
            q, sc = ref.cast_fp8(xs[s], round_scale) if use_fp8 else (xs[s], None)
            for t in range(xs[s].size(0)):
                seen = set()
                for e in topks[s][t].tolist():
                    if 0 <= e < E and e // El == j and e not in seen:
                        seen.add(e)
                        per_e[e - j * El].append((s, t, q[t], None if sc is None else sc[t]))
        out.append(per_e)
    return out


CASES = [
    dict(R=2, T=37, H=256, K=4, E=16, seed=1),
    dict(R=2, T=20, H=384, K=8, E=32, seed=2, drop=0.3),
    dict(R=3, T=9, H=128, K=3, E=12, seed=3, zero_rank=1),
    dict(R=2, T=16, H=256, K=4, E=8, seed=4, hot_expert=5),
    dict(R=4, T=6, H=128, K=2, E=8, seed=5, repeat=True),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"R{c['R']}-T{c['T']}-K{c['K']}-E{c['E']}-s{c['seed']}")
@pytest.mark.parametrize("use_fp8,round_scale", [(True, False), (True, True), (False, False)])
def test_dispatch_matches_token_loop(case, use_fp8, round_scale):
    c = dict(case)
    R, T, H, K, E = c.pop("R"), c.pop("T"), c.pop("H"), c.pop("K"), c.pop("E")
    xs, topks, _ = _inputs(R, T, H, K, E, **c)
    T_max = T + 3
    got = ref.dispatch(xs, topks, E, T_max, use_fp8=use_fp8, round_scale=round_scale)
    want = _brute(xs, topks, E, T_max, use_fp8, round_scale)
    El, RT = E // R, R * T_max
    for j in range(R):
        g = got[j]
        assert g.recv_x.shape == (El, RT, H) and g.recv_src_info.shape == (El, RT)
        assert torch.equal(g.recv_tokens, torch.tensor([x.size(0) for x in xs], dtype=torch.int32))
        for e in range(El):
            rows = want[j][e]
            assert int(g.recv_count[e]) == len(rows)
            begin = 0
            for s in [(j + si) % R for si in range(R)]:
                n = sum(1 for r in rows if r[0] == s)
                lr = int(g.recv_layout_range[e, s])
                assert (lr >> 32, lr & 0xFFFFFFFF) == (begin, n), f"rank {j} expert {e} source {s}"
                begin += n
            for i, (s, t, payload, sc) in enumerate(rows):
                assert int(g.recv_src_info[e, i]) == t
                assert torch.equal(g.recv_x[e, i].view(torch.uint8), payload.view(torch.uint8))
                if sc is not None:
                    assert torch.equal(g.recv_scales[e, i], sc)
                # the handle maps (source, token, k) back to this row
                ks = [k for k in range(K) if int(topks[s][t, k]) == j * El + e]
                for k in ks:
                    assert int(g.slot[s, t, k]) == e * RT + i
        # slot entries of experts on other ranks are -1
        for s in range(R):
            for t in range(xs[s].size(0)):
                for k in range(K):
                    ex = int(topks[s][t, k])
                    if not (0 <= ex < E and ex // El == j):
                        assert int(g.slot[s, t, k]) == -1
        # this rank's own tokens: the bitmask of their destination ranks
        for t in range(xs[j].size(0)):
            dests = {int(e) // El for e in topks[j][t].tolist() if 0 <= e < E}
            assert int(g.sent_mask[t]) == sum(1 << d for d in dests)


def test_hot_expert_fills_its_rows_and_zero_rank_sends_nothing():
    xs, topks, _ = _inputs(2, 8, 128, 2, 4, seed=9, hot_expert=1, zero_rank=0)
    got = ref.dispatch(xs, topks, 4, 8)
    # expert 1 lives on rank 0; only rank 1 has tokens, all of them pick it
    assert int(got[0].recv_count[1]) == xs[1].size(0)
    assert int(got[0].recv_layout_range[1, 0]) & 0xFFFFFFFF == 0
    assert torch.equal(got[1].recv_tokens, torch.tensor([0, xs[1].size(0)], dtype=torch.int32)) and xs[1].size(0) > 0


def test_fp8_cast_dequantizes_close_and_round_scale_gives_powers_of_two():
    g = torch.Generator().manual_seed(0)
    x = (torch.randn((5, 512), generator=g) * torch.logspace(-3, 3, 5).unsqueeze(1)).to(torch.bfloat16)
    x[2, :128] = 0  # an all-zero group stays finite (amax floor)
    for rs in (False, True):
        q, sc = ref.cast_fp8(x, round_scale=rs)
        assert q.dtype == torch.float8_e4m3fn and sc.shape == (5, 4)
        back = ref.dequantize(q, sc).float()
        assert torch.isfinite(back).all()
        err = (back - x.float()).abs().view(5, 4, 128).amax(2)
        assert (err <= x.float().abs().view(5, 4, 128).amax(2) * 0.07 + 1e-6).all()
        if rs:
            m = sc.view(torch.int32) & 0x7FFFFF
            assert (m == 0).all(), "round_scale scales are powers of two"


def test_ue8m0_pack_holds_the_exponent_bytes():
    sc = torch.tensor([[2.0 ** -3, 2.0 ** 0, 2.0 ** 5, 2.0 ** -20, 1.0, 0.5, 4.0, 8.0]], dtype=torch.float32)
    packed = ref.ue8m0_pack(sc)
    assert packed.shape == (1, 2)
    b = [(int(packed[0, i // 4]) >> (8 * (i % 4))) & 0xFF for i in range(8)]
    assert b == [127 - 3, 127, 127 + 5, 127 - 20, 127, 126, 129, 130]
    with pytest.raises(ValueError, match="4 scales"):
        ref.ue8m0_pack(torch.ones((1, 6)))


@pytest.mark.parametrize("case", CASES[:4], ids=lambda c: f"R{c['R']}-s{c['seed']}")
def test_combine_is_the_weighted_sum(case):
    c = dict(case)
    R, T, H, K, E = c.pop("R"), c.pop("T"), c.pop("H"), c.pop("K"), c.pop("E")
    xs, topks, ws = _inputs(R, T, H, K, E, **c)
    T_max = T
    disp = ref.dispatch(xs, topks, E, T_max, use_fp8=False)
    ys = [ref.expert_outputs(d, H, False, seed=7, rank=r) for r, d in enumerate(disp)]
    got = ref.combine(ys, disp, topks, ws)
    exact = ref.combine_exact(ys, disp, topks, ws)
    El = E // R
    for s in range(R):
        # token loop: sum over k of w * (expert output of the token's row)
        want = torch.zeros((xs[s].size(0), H), dtype=torch.float64)
        for t in range(xs[s].size(0)):
            for k in range(K):
                e = int(topks[s][t, k])
                if 0 <= e < E:
                    d = e // El
                    row = int(disp[d].slot[s, t, k]) % (R * T_max)
                    want[t] += float(ws[s][t, k]) * ys[d][e - d * El, row].double()
        assert torch.allclose(exact[s], want, rtol=1e-12, atol=1e-12)
        assert got[s].dtype == torch.bfloat16 and got[s].shape == (xs[s].size(0), H)
        assert calc_diff(got[s].double(), want) < 1e-5
        # a token without experts combines to zero
        none = (topks[s] < 0).all(1)
        assert (got[s][none] == 0).all()


def test_combine_masks_weights_of_minus_one_at_combine_time():
    xs, topks, ws = _inputs(2, 6, 128, 2, 4, seed=11)
    disp = ref.dispatch(xs, topks, 4, 6, use_fp8=False)
    ys = [ref.expert_outputs(d, 128, False, seed=1, rank=r) for r, d in enumerate(disp)]
    masked = [t.clone() for t in topks]
    masked[0][:, 1] = -1
    a = ref.combine(ys, disp, topks, [w.clone() for w in ws], combine_topks=masked)
    w0 = [w.clone() for w in ws]
    w0[0][:, 1] = 0.0
    b = ref.combine(ys, disp, topks, w0)
    assert torch.equal(a[0], b[0])


def test_dispatch_rejects_bad_arguments():
    xs, topks, _ = _inputs(2, 4, 128, 2, 4, seed=0)
    with pytest.raises(ValueError, match="multiple of the rank count"):
        ref.dispatch(xs, topks, 5, 4)
    with pytest.raises(ValueError, match="max 3"):
        ref.dispatch(xs, topks, 4, 3)
    with pytest.raises(ValueError, match="use_ue8m0"):
        ref.dispatch(xs, topks, 4, 4, use_ue8m0=True)
