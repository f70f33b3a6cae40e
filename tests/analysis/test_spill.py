"""profiler.analysis.spill: an entry's checksum is made as it is written, or (hash_on_write=False)
from its file when first asked for, and is the SHA-256 of the file's bytes (what a stored run's
index states and its reader checks)."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest

from profiler.analysis import spill


def test_checksum_made_when_asked_is_the_files(tmp_path, monkeypatch):
    calls = []
    real = spill.file_sha256

    def counted(path):
        calls.append(path)
        return real(path)
    monkeypatch.setattr(spill, "file_sha256", counted)
    sp = spill.Spill(tmp_path / "s", hash_on_write=False)
    arrays = {"a": np.arange(1000, dtype=np.int32), "b": np.array(["x", "yz"]), "n": np.asarray(7, np.int64)}
    sp.put("whatif-00000", arrays)
    sp.put("durations-00000", {"d": np.arange(10, dtype=np.int64)})
    assert calls == [], "hashed before anyone asked"
    assert "whatif-00000" in sp.sha256 and "other" not in sp.sha256
    data = sp.path("whatif-00000").read_bytes()
    assert sp.sha256["whatif-00000"] == hashlib.sha256(data).hexdigest()
    assert sp.sha256.get("whatif-00000") == hashlib.sha256(data).hexdigest()
    assert len(calls) == 1, "hashed again"
    assert sp.sizes["whatif-00000"] == len(data)
    _, size = spill.write(tmp_path / "again.arrays", arrays)
    assert spill.write(tmp_path / "thrice.arrays", arrays)[0] == sp.sha256["whatif-00000"] and size == len(data)
    got = sp.get("whatif-00000")
    assert np.array_equal(got["a"], arrays["a"]) and int(got["n"]) == 7
    sp.drop("durations-00000")
    assert "durations-00000" not in sp.sha256 and sp.sha256.get("durations-00000") is None
    assert len(calls) == 1, "a dropped entry was hashed"
    sp.adopt("whatif-00001", "ab" * 32, 10)
    assert sp.sha256["whatif-00001"] == "ab" * 32


def test_checksum_made_as_written_by_default(tmp_path, monkeypatch):
    """The what-if inputs' spill (every checksum asked for) hashes the bytes as it writes them:
    never the file again (a mapping of it counted in the process's RSS at the chunk's peak)."""
    monkeypatch.setattr(spill, "file_sha256", lambda path: pytest.fail("hashed from the file"))
    sp = spill.Spill(tmp_path / "w")
    arrays = {"a": np.arange(100_000, dtype=np.int64)}
    sp.put("whatif-00000", arrays)
    data = sp.path("whatif-00000").read_bytes()
    assert sp.sha256["whatif-00000"] == hashlib.sha256(data).hexdigest()
    assert sp.sizes["whatif-00000"] == len(data)


def test_file_sha256_reads_in_blocks(tmp_path, monkeypatch):
    monkeypatch.setattr(spill, "HASH_BLOCK", 7)
    for n in (0, 1, 7, 8, 1000):
        p = tmp_path / f"f{n}"
        p.write_bytes(bytes(range(256)) * (n // 256) + bytes(range(n % 256)))
        assert spill.file_sha256(p) == hashlib.sha256(p.read_bytes()).hexdigest()


def test_file_sha256_of_an_empty_file(tmp_path):
    p = tmp_path / "e"
    p.write_bytes(b"")
    assert spill.file_sha256(p) == hashlib.sha256(b"").hexdigest()


def test_a_spill_travels_pickled_with_its_checksums(tmp_path):
    """A distributed run sends its Spill to the workers pickled: entries known, hashed or not yet."""
    import pickle
    sp = spill.Spill(tmp_path / "s")
    sp.put("whatif-00000", {"a": np.arange(10)})
    sp.put("whatif-00001", {"a": np.arange(11)})
    want = sp.sha256["whatif-00001"]
    back = pickle.loads(pickle.dumps(sp))
    assert "whatif-00000" in back.sha256 and back.sha256["whatif-00001"] == want
    assert back.sha256["whatif-00000"] == hashlib.sha256(sp.path("whatif-00000").read_bytes()).hexdigest()
