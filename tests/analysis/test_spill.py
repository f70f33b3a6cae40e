"""profiler.analysis.spill: an entry's checksum is the SHA-256 of its file's bytes, made as they are
written (what a stored run's index states and its reader checks), or not made at all for a spill
that keeps none (the report's span durations); packed arrays read back exactly as put, or as
Damaged."""
from __future__ import annotations

import hashlib
import pickle
import struct

import numpy as np
import pytest

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


def test_packed_arrays_read_back_as_put_and_only_where_they_are_smaller(tmp_path):
    """spill.sparse / spill.runs (the what-if inputs' fields of mostly one value, issue 31): a file
    holding one is version 2 and reads back the array as it was, dtype included (packed=True: the
    Sparse / Runs as stored); a file without any stays version 1 (what every reader reads)."""
    occ = np.full(10_000, -1, np.int32)
    occ[[3, 500, 9_999]] = [7, 0, 2]
    lane = np.repeat(np.arange(5, dtype=np.int16), [1, 4000, 3000, 2998, 1])
    first = np.zeros(10_000, bool)
    first[[0, 4000]] = True
    arrays = {"occ": spill.sparse(occ, -1), "lane": spill.runs(lane), "first": spill.sparse(first, False),
              "plain": np.arange(7, dtype=np.int64), "empty": spill.runs(np.zeros(0, np.int32))}
    assert isinstance(arrays["occ"], spill.Sparse) and isinstance(arrays["lane"], spill.Runs)
    assert arrays["occ"].nbytes == 3 * 8 and arrays["lane"].nbytes == 5 * (4 + 2)
    spill.write(tmp_path / "p.arrays", arrays)
    spill.write(tmp_path / "v1.arrays", {"plain": np.arange(7, dtype=np.int64)})
    assert spill._PRE.unpack_from((tmp_path / "p.arrays").read_bytes())[1] == 2
    assert spill._PRE.unpack_from((tmp_path / "v1.arrays").read_bytes())[1] == 1
    got = spill.read(tmp_path / "p.arrays")
    for k, want in {"occ": occ, "lane": lane, "first": first, "plain": np.arange(7), "empty": np.zeros(0, np.int32)}.items():
        assert got[k].dtype == want.dtype and np.array_equal(got[k], want), k
    raw = spill.read(tmp_path / "p.arrays", packed=True)
    assert isinstance(raw["occ"], spill.Sparse) and raw["occ"].fill == -1 and raw["occ"].index.tolist() == [3, 500, 9999]
    assert isinstance(raw["lane"], spill.Runs) and raw["lane"].start.tolist() == [0, 1, 4001, 7001, 9999]
    # where packing would not be smaller the array is kept as it is
    dense = np.arange(100, dtype=np.int32)
    assert spill.sparse(dense, 0) is dense and spill.runs(dense) is dense
    assert spill.narrowest(np.array([0, 4344], np.int32)).dtype == np.int16
    assert spill.narrowest(np.array([-1, 11], np.int32)).dtype == np.int8
    assert spill.narrowest(np.array([0, 2**31 - 1], np.int64)).dtype == np.int32
    assert spill.narrowest(spill.runs(lane.astype(np.int64))).dtype == np.int8
    with pytest.raises(ValueError):
        spill.sparse(occ, 2**40)             # a fill its dtype does not hold


def _damaged(tmp_path, value) -> None:
    p = tmp_path / "bad.arrays"
    if p.exists():
        p.unlink()
    spill.write(p, {"x": value})
    with pytest.raises(spill.Damaged, match="rebuild"):
        spill.read(p)


def test_a_packed_array_that_does_not_rebuild_one_is_damaged(tmp_path):
    v = np.arange(3, dtype=np.int32)
    _damaged(tmp_path, spill.Sparse(index=np.array([1, 10], np.int32), value=v[:2], fill=0, n=10))    # past the end
    _damaged(tmp_path, spill.Sparse(index=np.array([5, 2], np.int32), value=v[:2], fill=0, n=10))     # not ascending
    _damaged(tmp_path, spill.Sparse(index=np.array([-1, 2], np.int32), value=v[:2], fill=0, n=10))
    _damaged(tmp_path, spill.Sparse(index=np.array([1, 2, 3], np.int32), value=v[:2], fill=0, n=10))  # lengths
    _damaged(tmp_path, spill.Sparse(index=np.array([1.0, 2.0]), value=v[:2], fill=0, n=10))           # positions
    _damaged(tmp_path, spill.Sparse(index=np.array([1, 2], np.int32), value=v[:2], fill=2**40, n=10))  # fill
    _damaged(tmp_path, spill.Runs(start=np.array([1, 4], np.int32), value=v[:2], n=10))                # not from 0
    _damaged(tmp_path, spill.Runs(start=np.array([0, 4, 4], np.int32), value=v, n=10))                 # an empty run
    _damaged(tmp_path, spill.Runs(start=np.array([0], np.int32), value=v[:1], n=0))
    # a packed array in a file that says version 1 (the layout before packing)
    p = tmp_path / "v1.arrays"
    spill.write(p, {"x": spill.Runs(start=np.array([0], np.int32), value=v[:1], n=5)})
    b = bytearray(p.read_bytes())
    struct.pack_into("<I", b, 8, 1)
    p.write_bytes(bytes(b))
    with pytest.raises(spill.Damaged, match="version 1"):
        spill.read(p)
