"""Every proof opens as a notebook: jupytext reads it into markdown and code cells, writes it back
unchanged (clean diffs), and its cells run top to bottom as a notebook would run them."""

from __future__ import annotations


import sys
import types

import jupytext
import pytest

from tests.pages import ROOT

PROOFS = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "proofs").rglob("proof_*.py"))


def test_there_are_proofs():
    assert len(PROOFS) >= 3


@pytest.mark.parametrize("proof", PROOFS)
def test_proof_is_a_percent_notebook_that_round_trips(proof):
    text = (ROOT / proof).read_text(encoding="utf-8")
    nb = jupytext.reads(text, fmt="py:percent")
    kinds = {c.cell_type for c in nb.cells}
    assert kinds == {"markdown", "code"}, f"{proof}: needs markdown and code cells, got {kinds}"
    assert nb.cells[0].cell_type == "markdown" or nb.cells[1].cell_type == "markdown"
    body = lambda t: t.split("# ---\n", 2)[-1].strip()  # noqa: E731 (jupytext adds its version to the header)
    assert body(jupytext.writes(nb, fmt="py:percent")) == body(text), f"{proof}: jupytext round trip changes it"


@pytest.mark.parametrize("proof", PROOFS)
def test_notebook_cells_define_the_measurements(proof):
    """Run the code cells in order, as a kernel would, except the demo cell (`if __name__ == "__main__"`)
    whose experiments the tests already run."""
    nb = jupytext.reads((ROOT / proof).read_text(encoding="utf-8"), fmt="py:percent")
    module = types.ModuleType("notebook")  # a real module, as a kernel's __main__ is (dataclasses need one)
    sys.modules["notebook"] = module
    try:
        for cell in nb.cells:
            if cell.cell_type == "code":
                exec(compile(cell.source, f"{proof}[cell]", "exec"), module.__dict__)
    finally:
        del sys.modules["notebook"]
    ns = module.__dict__
    assert any(callable(v) and getattr(v, "__module__", None) == "notebook" for v in ns.values())
    assert any(k.startswith("test_") for k in ns), f"{proof}: defines no test functions"
