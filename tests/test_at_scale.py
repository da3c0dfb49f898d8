"""The at-scale runner (proofs/at_scale.py), its record format and the boxes rendered from it.

The runner is tested for real: the `tiny` preset trains every arm of the shared model on the real corpus for a few
steps (CI never sees a GPU); the committed records are checked for the fields the pages rely on and for a summary
that matches their runs; the readings are checked on literal numbers."""

from __future__ import annotations

import json
import statistics
import sys

import pytest

from proofs import scale_record as R
from tests.pages import ROOT

sys.path.insert(0, str(ROOT / "docs" / "hooks"))
import scale_box  # noqa: E402


@pytest.fixture(scope="module")
def tiny_record(tmp_path_factory) -> dict:
    from proofs import at_scale as A

    out = tmp_path_factory.mktemp("at_scale") / "tiny.json"
    assert A.main(["--preset", "tiny", "--steps", "3", "--out", str(out)]) == 0
    return json.loads(out.read_text())


def test_the_tiny_preset_runs_every_arm_and_writes_a_complete_record(tiny_record):
    """Every arm at every seed trains, is scored at 1x, 2x and 4x its length and lands in the record; the record
    has every field the boxes read, a summary per arm, and the corpus identity."""
    from proofs import at_scale as A

    p = A.PRESETS["tiny"]
    assert R.check_record(tiny_record) == []
    assert sorted((r["arm"], r["seed"]) for r in tiny_record["runs"]) == sorted(A.plan(p))
    assert set(tiny_record["summary"]) == set(A.arms(p))
    run = next(r for r in tiny_record["runs"] if r["arm"] == "base")
    for key in ("val", "val_2x", "val_2x_beyond", "val_4x", "val_4x_beyond", "train_eval", "ece", "confidence",
                "attn_entropy", "largest_logit", "attn_entropy_init", "largest_logit_init"):
        assert key in run and run[key] == run[key], key  # present and not NaN
    assert tiny_record["corpus"]["sha256"] and tiny_record["corpus"]["bytes"] > 10_000_000  # the 10 MB
    assert tiny_record["training_fingerprint"] == R.training_fingerprint()
    for name in R.COMPARISONS:  # every page's comparison can be read from a fresh record
        assert R.compare(tiny_record, name)["rows"], name


def test_one_switch_per_arm(tiny_record):
    """Each arm differs from the baseline configuration in the fields its switch names and no others."""
    from dataclasses import asdict

    from proofs import at_scale as A

    p = A.PRESETS["tiny"]
    base = asdict(A.base_config(p))
    for name, arm in A.arms(p).items():
        cfg = asdict(A.base_config(p).__class__(**{**base, **arm.switches}))
        changed = {k for k in base if cfg[k] != base[k]}
        assert changed == set(arm.switches), (name, changed)


@pytest.mark.parametrize("name", ["gpu", "gpu-longer"])  # gpu-longer: a partial longer run, where one is committed
def test_the_committed_records_are_complete_and_consistent(name):
    """The committed record's summary is what its runs say (mean and sd per arm), it names its device, corpus and
    training code, and the longer partial run says which arms it lacks."""
    path = R.RECORDS / f"{name}.json"
    if not path.is_file():
        pytest.skip(f"no {path.name} committed")
    r = json.loads(path.read_text())
    assert R.check_record(r) == []
    assert len(r["corpus"]["sha256"]) == 64 and r["corpus"]["bytes"] >= 10_000_000
    for arm, s in r["summary"].items():
        vals = [x["val"] for x in r["runs"] if x["arm"] == arm and "val" in x]
        assert s["val"]["mean"] == pytest.approx(statistics.fmean(vals)), arm
        assert s["val"]["sd"] == pytest.approx(statistics.stdev(vals) if len(vals) > 1 else 0.0), arm
    if r.get("partial"):
        assert r["missing_arms"] and r["measured"] == ["val"]
    else:
        assert r["steps"] >= r["preset"]["min_steps"]


@pytest.mark.parametrize("diff, se, expect, reading", [
    (-0.30, 0.05, -1, "holds"), (0.30, 0.05, -1, "flips"), (-0.10, 0.05, -1, "within noise"),
    (0.01, 0.05, 0, "holds"), (0.30, 0.05, 0, "differs"), (-0.30, 0.05, None, "lower"), (0.1, 0.05, None, "within noise"),
])
def test_readings(diff, se, expect, reading):
    """A difference counts at 3 standard errors; the toy's direction decides holds vs flips."""
    assert R.outcome(diff, se, expect)[1] == reading


def test_the_training_fingerprint_ignores_scheduling_but_not_training(tmp_path):
    """Editing the step timing leaves a record fresh; editing what a run computes makes it stale."""
    src = (ROOT / "proofs" / "at_scale.py").read_text()
    timing = tmp_path / "timing.py"
    timing.write_text(src.replace("def time_steps(", "def time_steps(  # faster timing\n    "))
    training = tmp_path / "training.py"
    training.write_text(src.replace("weight_decay\": 0.1", "weight_decay\": 0.2"))
    assert training.read_text() != src
    assert R.training_fingerprint(timing) == R.training_fingerprint()
    assert R.training_fingerprint(training) != R.training_fingerprint()


def test_the_training_fingerprint_covers_the_model_files_a_run_imports(tmp_path):
    """A new module of the shared package that the runs never import (an adapter, a mixer in its own file) leaves a
    record fresh; an edit to one they do import (models.py, or config.py through it) makes it stale."""
    import shutil
    pkg = tmp_path / "transformer"
    shutil.copytree(ROOT / "proofs" / "transformer", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    before = R.training_fingerprint(package=pkg)
    assert before == R.training_fingerprint()
    assert {"models.py", "attention.py", "config.py", "layers.py"} <= {f.name for f in R.model_files(pkg)}
    assert "lora.py" not in {f.name for f in R.model_files(pkg)}
    (pkg / "new_adapter.py").write_text("X = 1\n")
    assert R.training_fingerprint(package=pkg) == before
    (pkg / "config.py").write_text((pkg / "config.py").read_text() + "\n# an edit\n")
    assert R.training_fingerprint(package=pkg) != before


def test_boxes_render_from_the_record_and_say_when_there_is_none(tmp_path, monkeypatch):
    """A marker becomes a table with the reading; without records the box says how to make one; an unknown name
    is an error naming the known ones."""
    text = '!!! example "At scale"\n    <!-- at-scale: swiglu -->\n'
    if R.records()[0] is not None:
        out = scale_box.render(text, lambda uri: uri)
        assert "| measurement |" in out and "<!-- at-scale" not in out
        assert all(ln.startswith("    ") or not ln for ln in out.splitlines()[1:]), "stays inside the admonition"
    monkeypatch.setattr(R, "RECORDS", tmp_path)
    monkeypatch.setattr(R.records, "__defaults__", (tmp_path,))
    assert "No at-scale record yet" in scale_box.render(text, lambda uri: uri)
    with pytest.raises(ValueError, match="known: all, sqrt_dk"):
        scale_box.render("<!-- at-scale: nope -->\n", lambda uri: uri)


def test_two_runs_at_once_keep_their_own_queues(tmp_path):
    """Two runners started together (two test workers, a reader's second terminal) each train and record every run:
    the run queue is per invocation, not one file per preset that the second run would clear and claim from."""
    import os
    import subprocess

    from proofs import at_scale as A

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    outs = [tmp_path / f"run{i}.json" for i in range(2)]
    arms = ["base", "rope", "alibi"]  # a few runs each are enough to collide
    procs = [subprocess.Popen([sys.executable, "-m", "proofs.at_scale", "--preset", "tiny", "--steps", "1", "--arms",
                               ",".join(arms), "--out", str(out)], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for out in outs]
    for proc in procs:
        assert proc.wait(timeout=300) == 0, proc.stderr.read()[-2000:]
    plan = sorted(r for r in A.plan(A.PRESETS["tiny"]) if r[0] in arms)
    for out in outs:
        assert sorted((r["arm"], r["seed"]) for r in json.loads(out.read_text())["runs"]) == plan
