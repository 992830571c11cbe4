"""What a fresh interpreter has loaded after running some code (for import-time checks)."""

from __future__ import annotations

import subprocess
import sys


def loaded_modules(code: str) -> set[str]:
    """The names in ``sys.modules`` after ``code`` runs in a new ``python -P`` (so the working
    directory cannot stand in for an installed package)."""
    out = subprocess.run(
        [sys.executable, "-P", "-c", code + "\nimport sys\nprint('\\n'.join(sys.modules))"],
        capture_output=True, text=True, check=True,
    ).stdout
    return set(out.split())
