"""proofs/restamp.py: a seed record takes a new fingerprint only when runs before and after the change agree number
for number at enough seeds, and only when the record was current before the change."""
import json

from proofs import restamp, seeds

PROOF = "proofs/area/proof_x.py"


def _evidence(folder, test, seed, fingerprint, values, outcome="passed"):
    path = folder / PROOF / f"{test}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"proof": PROOF, "test": test, "outcome": outcome,
           "measurements": [{"name": f"m{i}", "value": v} for i, v in enumerate(values)],
           "provenance": {"seed": seed, "threads": 1, "fingerprint": fingerprint}}
    path.write_text(json.dumps(doc), encoding="utf-8")


def _record(tmp_path, monkeypatch, prints: dict[str, str]):
    monkeypatch.setattr(seeds, "REPORTS", tmp_path / "seeds")
    path = seeds.report_path(PROOF)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"proof": PROOF, "tests": {t: {"fingerprint": f} for t, f in prints.items()}}))
    return path


def test_only_identical_current_records_are_restamped(tmp_path, monkeypatch):
    record = _record(tmp_path, monkeypatch, {"test_same": "old", "test_moved": "old", "test_stale": "older",
                                             "test_one_seed": "old"})
    pairs = []
    for seed in (0, 4242):
        old, new = tmp_path / f"old{seed}", tmp_path / f"new{seed}"
        pairs += ["--pair", str(old), str(new)]
        for test in ("test_same", "test_stale"):
            _evidence(old, test, seed, "old", [seed, 0.5])
            _evidence(new, test, seed, "new", [seed, 0.5])
        _evidence(old, "test_moved", seed, "old", [seed, 0.5])
        _evidence(new, "test_moved", seed, "new", [seed, 0.5 + (seed == 4242) * 1e-9])  # one value, one seed
        if seed == 0:
            _evidence(old, "test_one_seed", seed, "old", [1.0])
            _evidence(new, "test_one_seed", seed, "new", [1.0])
    restamp.main(pairs)  # a dry run writes nothing
    assert {t: e["fingerprint"] for t, e in json.loads(record.read_text())["tests"].items()}["test_same"] == "old"
    restamp.main([*pairs, "--write"])
    got = {t: e["fingerprint"] for t, e in json.loads(record.read_text())["tests"].items()}
    assert got == {"test_same": "new", "test_moved": "old", "test_stale": "older", "test_one_seed": "old"}


def test_a_failed_run_or_another_thread_count_is_not_identical(tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    _evidence(old, "test_a", 0, "old", [1.0])
    _evidence(new, "test_a", 0, "new", [1.0], outcome="failed")
    _evidence(old, "test_b", 0, "old", [1.0])
    _evidence(new, "test_b", 0, "new", [1.0])
    doc = json.loads((new / PROOF / "test_b.json").read_text())
    doc["provenance"]["threads"] = 2
    (new / PROOF / "test_b.json").write_text(json.dumps(doc))
    ok, why = restamp.verify([(old, new)], min_seeds=1)
    assert not ok and set(why) == {(PROOF, "test_a"), (PROOF, "test_b")}


def test_last_place_and_rounding_residue_differences_count_as_equal(tmp_path):
    """What LAPACK varies from run to run is equal: floats both below 1e-12 in size, or within a few units in the last
    place; any larger difference, however small in absolute terms, is not."""
    old, new = tmp_path / "old", tmp_path / "new"
    pairs = {"test_lapack": ([[4.556755013038322e-16, 0.7393622177429917]], [[4.727428135136247e-16, 0.7393622177429918]]),
             "test_exact_zero": ([0.0, 3], [4e-16, 3]), "test_small": ([1e-9], [1.000001e-9]),
             "test_one_side": ([5e-16], [2e-12]), "test_relative": ([0.5], [0.5 + 1e-12]), "test_int": ([3], [4])}
    for test, (a, b) in pairs.items():
        _evidence(old, test, 0, "old", a)
        _evidence(new, test, 0, "new", b)
    ok, why = restamp.verify([(old, new)], min_seeds=1)
    assert set(ok) == {(PROOF, "test_lapack"), (PROOF, "test_exact_zero")}
    assert set(why) == {(PROOF, t) for t in ("test_small", "test_one_side", "test_relative", "test_int")}
