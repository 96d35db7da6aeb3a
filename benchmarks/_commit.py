"""The commit of the frugalrl checkout a benchmark measures (the one imported: another's on ``PYTHONPATH`` for a
"before" run), marked when that checkout has uncommitted changes."""

from __future__ import annotations

import subprocess
from pathlib import Path

import frugalrl


def measured_commit() -> str:
    """Short hash of the imported frugalrl's checkout, plus " (with uncommitted changes)" where its ``src`` differs."""
    src = Path(frugalrl.__file__).parent
    commit = subprocess.run(["git", "-C", str(src), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    if subprocess.run(["git", "-C", str(src), "status", "--porcelain", "."], capture_output=True, text=True).stdout:
        commit += " (with uncommitted changes)"
    return commit
