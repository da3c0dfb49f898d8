"""The site's notebooks (docs/hooks/study.py: notebooks): every proof as an .ipynb, converted again only when the
proof changed."""

from __future__ import annotations

import json
import sys

from tests.pages import ROOT

sys.path.insert(0, str(ROOT / "docs" / "hooks"))
import study  # noqa: E402  (docs/hooks/study.py, as the evidence hook imports it)

PROOF = '''# %% [markdown]
# A tiny proof.

# %%
def test_one():
    assert 1 + 1 == 2
'''


def test_a_notebook_is_converted_once_and_again_when_its_proof_changes(tmp_path):
    root, out = tmp_path / "repo", tmp_path / "out"
    proof = root / "proofs" / "area" / "proof_tiny.py"
    proof.parent.mkdir(parents=True)
    proof.write_text(PROOF, encoding="utf-8")
    made = study.notebooks(root, out)
    target = made["notebooks/area/proof_tiny.ipynb"]
    nb = json.loads(target.read_text(encoding="utf-8"))
    assert nb["metadata"]["kernelspec"]["name"] == "python3"
    assert nb["metadata"]["jupytext"]["source"] == "proofs/area/proof_tiny.py"
    assert [c["cell_type"] for c in nb["cells"]] == ["markdown", "code"]
    stamp = target.stat().st_mtime_ns
    study.notebooks(root, out)
    assert target.stat().st_mtime_ns == stamp, "an unchanged proof was converted again"
    proof.write_text(PROOF.replace("1 + 1 == 2", "2 + 2 == 4"), encoding="utf-8")
    study.notebooks(root, out)
    assert "2 + 2 == 4" in "".join(json.loads(target.read_text(encoding="utf-8"))["cells"][1]["source"])
    target.unlink()  # a deleted notebook comes back even though its proof did not change
    study.notebooks(root, out)
    assert target.exists()
