"""profiler.analysis.spill: an entry's checksum is the SHA-256 of its file's bytes, made as they are
written (what a stored run's index states and its reader checks), or not made at all for a spill
that keeps none (the report's span durations)."""
from __future__ import annotations

import hashlib
import pickle

import numpy as np

from profiler.analysis import spill


def test_checksum_made_as_written_is_the_files(tmp_path):
    sp = spill.Spill(tmp_path / "s")
    arrays = {"a": np.arange(1000, dtype=np.int32), "b": np.array(["x", "yz"]), "n": np.asarray(7, np.int64)}
    sp.put("whatif-00000", arrays)
    assert "whatif-00000" in sp.sha256 and "other" not in sp.sha256
    data = sp.path("whatif-00000").read_bytes()
    assert sp.sha256["whatif-00000"] == hashlib.sha256(data).hexdigest()
    assert sp.sizes["whatif-00000"] == len(data)
    _, size = spill.write(tmp_path / "again.arrays", arrays)
    assert spill.write(tmp_path / "thrice.arrays", arrays)[0] == sp.sha256["whatif-00000"] and size == len(data)
    got = sp.get("whatif-00000")
    assert np.array_equal(got["a"], arrays["a"]) and int(got["n"]) == 7
    sp.drop("whatif-00000")
    assert "whatif-00000" not in sp.sha256 and sp.sha256.get("whatif-00000") is None
    sp.adopt("whatif-00001", "ab" * 32, 10)
    assert sp.sha256["whatif-00001"] == "ab" * 32


def test_a_spill_without_checksums_hashes_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(spill.hashlib, "sha256", lambda *a: (_ for _ in ()).throw(AssertionError("hashed")))
    sp = spill.Spill(tmp_path / "d", checksums=False)
    sp.put("durations-00000", {"d": np.arange(10, dtype=np.int64)})
    assert "durations-00000" not in sp.sha256
    assert sp.sizes["durations-00000"] == sp.path("durations-00000").stat().st_size
    assert np.array_equal(sp.get("durations-00000")["d"], np.arange(10))


def test_a_spill_travels_pickled_with_its_checksums(tmp_path):
    """A distributed run sends its Spill to the workers pickled: the entries it knows, with theirs."""
    sp = spill.Spill(tmp_path / "s")
    sp.put("whatif-00000", {"a": np.arange(10)})
    sp.put("whatif-00001", {"a": np.arange(11)})
    back = pickle.loads(pickle.dumps(sp))
    assert back.sha256 == sp.sha256
    assert back.sha256["whatif-00000"] == hashlib.sha256(sp.path("whatif-00000").read_bytes()).hexdigest()
