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
