"""The proof plugin's bookkeeping: evidence of tests that no longer exist is removed when their proof file runs."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROOF = "proofs/generation/proof_repetition.py"
FAST = "test_dividing_a_negative_logit_by_theta_raises_its_probability"


def test_orphan_evidence_is_pruned_and_current_evidence_kept(tmp_path):
    folder = tmp_path / PROOF
    folder.mkdir(parents=True)
    (folder / "test_renamed_long_ago.json").write_text("{}", encoding="utf-8")
    (folder / "test_renamed_long_ago.loss curve.svg").write_text("<svg/>", encoding="utf-8")
    (folder / "test_penalties_on_the_trained_model.json").write_text("{}", encoding="utf-8")  # defined, not run
    env = {**os.environ, "PROOF_EVIDENCE_DIR": str(tmp_path), "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-m", "pytest", PROOF, "-k", FAST, "-q", "-p", "no:cacheprovider",
                          "-p", "no:xdist"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    left = sorted(p.name for p in folder.iterdir())
    assert left == ["test_dividing_a_negative_logit_by_theta_raises_its_probability.json",
                    "test_penalties_on_the_trained_model.json"]


def test_stale_lists_exactly_the_proof_files_without_current_evidence(tmp_path, monkeypatch):
    """`python -m proofs.stale` (what `make serve` runs first): a proof file is current only when every test in it
    has passed evidence for this seed and this code; anything else puts the file on the rerun list."""
    import json

    from proofs import evidence as E
    from proofs import stale

    monkeypatch.setattr(E, "EVIDENCE_DIR", tmp_path)
    everything, current = stale.stale_files(seed=0)
    assert current == 0 and PROOF in everything and len(everything) > 40
    names = stale.test_names(ROOT / PROOF)
    assert FAST in names and "test_penalties_on_the_trained_model" in names

    def write(name, **provenance):
        doc = {"outcome": "passed", "provenance": {"seed": 0, "fingerprint": E.fingerprint(ROOT / PROOF), **provenance}}
        path = E.evidence_path(PROOF, name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc), encoding="utf-8")

    for name in names:
        write(name)
    listed, current = stale.stale_files(seed=0)
    assert PROOF not in listed and current == len(names)
    assert PROOF in stale.stale_files(seed=7)[0]  # another seed: rerun
    write(FAST, fingerprint="0" * 16)  # older code: rerun
    assert PROOF in stale.stale_files(seed=0)[0]


def test_a_fingerprint_covers_what_the_proof_reaches_and_nothing_else(tmp_path, monkeypatch):
    """A proof's fingerprint changes when its own file, a set-up module it imports, or a file of the shared model
    that holds (or is imported by) a name it imports changes; a new module of the model package that it never
    reaches, or an unrelated set-up module, leaves it (and the evidence and seed records stamped with it) current."""
    import shutil

    from proofs import evidence as E
    root = tmp_path / "repo"
    shutil.copytree(ROOT / "proofs", root / "proofs", ignore=shutil.ignore_patterns("__pycache__", "*.txt", "*.yml"))
    monkeypatch.setattr(E, "ROOT", root)
    proof = root / "proofs" / "generation" / "proof_lora.py"  # imports tasks, train, DecoderLM, apply_lora ...
    reached = {p.relative_to(root).as_posix() for p in E.imported_modules(proof)}
    assert {"proofs/train.py", "proofs/transformer/lora.py", "proofs/transformer/models.py",
            "proofs/transformer/config.py"} <= reached
    assert not {"proofs/transformer/__init__.py", "proofs/transformer/speculative.py", "proofs/distributed.py"} & reached
    before = E.fingerprint(proof)
    (root / "proofs" / "transformer" / "new_mixer.py").write_text("from .config import ConfigError\n")
    init = root / "proofs" / "transformer" / "__init__.py"
    init.write_text(init.read_text() + "from .new_mixer import ConfigError as _unused\n")
    (root / "proofs" / "distributed.py").write_text((root / "proofs" / "distributed.py").read_text() + "# edit\n")
    assert E.fingerprint(proof) == before
    for changed in ("transformer/feedforward.py", "train.py", "evidence.py"):  # reached through models.py; imported; always
        f = root / "proofs" / changed
        f.write_text(f.read_text() + "# edit\n")
        assert E.fingerprint(proof) != before, changed
        before = E.fingerprint(proof)


def test_files_sharing_a_cached_set_up_are_one_unit_of_work():
    """Under --dist loadfile the proof files that reach a cached set-up (CACHED_SETUPS) run on one worker: the
    scheduler's quick reading of import lines must agree with the fingerprint's import closure for every proof file,
    and every other file stays its own unit."""
    from proofs import evidence as E
    from proofs.pytest_plugin import CACHED_SETUPS, work_unit

    units = {}
    for path in sorted((ROOT / "proofs").rglob("proof_*.py")):
        rel = path.relative_to(ROOT).as_posix()
        reached = [m.name for m in E.imported_modules(path)
                   if m.parent == ROOT / "proofs" and m.name in CACHED_SETUPS]
        assert work_unit(rel) == (f"proofs/{reached[0]}" if reached else rel), rel
        units.setdefault(work_unit(rel), []).append(rel)
    for setup in CACHED_SETUPS:
        assert len(units[f"proofs/{setup}"]) >= 2, f"{setup} is shared by fewer than two proof files: drop it"
    assert work_unit("tests/test_plugin.py") == "tests/test_plugin.py"
