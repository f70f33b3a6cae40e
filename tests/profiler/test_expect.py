"""profiler.groundtruth.expect: the expect block round-trips and rejects what breaks its schema."""
import json

import pytest

from profiler.groundtruth.expect import Cause, ComparisonExpect, Direction, Effect, Expect, ExpectError, from_manifest


def _ab_side(side, replicate):
    return Expect(cause=Cause.NONE, comparison=ComparisonExpect(
        group="ab-num-sms", side=side, replicate=replicate, outcome=Cause.KNOB_CHANGE, knob="num_sms",
        value=24 if side == "A" else 64, kernel="dispatch", direction=Direction.FASTER))


def test_round_trip_through_json():
    cases = [
        Expect(cause=Cause.NONE),
        Expect(cause=Cause.RANK_IMBALANCE, rank=0, kernel="dispatch", phase="recv_copy",
               effect=Effect("rows_received_ratio", 2.3, "x"), planted_by="cmd", extra={"seed": 3}),
        Expect(cause=Cause.TIMEOUT, rank=0, peer=1, kernel="dispatch", phase="wait_data"),
        _ab_side("B", 2),
        Expect(cause=Cause.RANK_IMBALANCE, rank=0, late_entry="gpu"),
        Expect(cause=Cause.NONE, rank=1, late_entry="host"),
    ]
    for e in cases:
        back = Expect.from_json(json.loads(json.dumps(e.to_json())))
        assert back == e
        assert back.alarm == (e.cause is not Cause.NONE)


def test_from_manifest_without_block_is_none():
    assert from_manifest({"name": "x"}) is None
    assert from_manifest({"expect": Expect(cause=Cause.NONE).to_json()}).cause is Cause.NONE


@pytest.mark.parametrize("bad, field", [
    ({"schema": 2, "cause": "none"}, "schema"),
    ({"schema": 1, "cause": "slow"}, "cause"),
    ({"schema": 1, "cause": "rank_imbalance"}, "rank"),
    ({"schema": 1, "cause": "timeout", "rank": 0}, "peer"),
    ({"schema": 1, "cause": "none", "rank": -1}, "rank"),
    ({"schema": 1, "cause": "none", "rank": True}, "rank"),
    ({"schema": 1, "cause": "none", "bogus": 1}, "unknown"),
    ({"schema": 1, "cause": "same_code"}, "comparison outcome"),
    ({"schema": 1, "cause": "none", "effect": {"metric": "m", "value": "x", "unit": "s"}}, "effect.value"),
    ({"schema": 1, "cause": "none", "comparison": {"group": "g", "side": "C", "replicate": 0,
                                                     "outcome": "same_code"}}, "side"),
    ({"schema": 1, "cause": "none", "comparison": {"group": "g", "side": "A", "replicate": 0,
                                                     "outcome": "knob_change", "knob": "k"}}, "direction"),
    ({"schema": 1, "cause": "none", "comparison": {"group": "g", "side": "A", "replicate": 0,
                                                     "outcome": "same_code", "direction": "faster"}}, "direction"),
    ([1, 2], "object"),
    ({"schema": 1, "cause": "host_bound", "rank": 1, "late_entry": "disk"}, "late_entry"),
    ({"schema": 1, "cause": "host_bound", "late_entry": "host"}, "late_entry needs the rank"),
    # a GPU-side late entry is the late rank's own work (late_entry.SIDE_CAUSE), not its host
    ({"schema": 1, "cause": "host_bound", "rank": 0, "late_entry": "gpu"}, "late_entry 'gpu' goes with"),
])
def test_rejects_with_the_field_named(bad, field):
    with pytest.raises(ExpectError, match=field):
        Expect.from_json(bad)


def test_a_block_without_a_late_entry_is_written_as_before():
    # older readers reject unknown fields: the key appears only where a late entry was planted
    assert "late_entry" not in Expect(cause=Cause.HOST_BOUND, rank=1).to_json()
    assert Expect(cause=Cause.HOST_BOUND, rank=1, late_entry="host").to_json()["late_entry"] == "host"
