"""Coding drills: the implementation questions of coding rounds, checked against the shared model.

Each `drill_*.py` holds a function to write (signature and docstring given, body `raise NotImplementedError`)
and tests that compare it with the shared model's own code on random and edge-case inputs:

    pytest proofs/drills/drill_rmsnorm.py          # fails until you implement it, then passes

`PAGE = "area/page.md"` names the question page that links the drill. CI runs every drill with
DRILLS=reference, which puts the shared model's code in place of yours (tests/test_drills.py), so the
tests themselves are checked and a drill cannot silently rot.
"""

from __future__ import annotations

import os


def pick(yours, reference):
    """The function under test: yours, or with DRILLS=reference the reference built from the shared model."""
    return reference if os.environ.get("DRILLS") == "reference" else yours
