"""Every repo path and every dotted ``radixtop.`` name that the code, the docs and ``.ci/`` mention
still exists: moves leave no stale reference behind (docstrings, comments, README, docs/)."""

from __future__ import annotations

import importlib
import re
import subprocess
from functools import cache

from tests.support import REPO

PATH = re.compile(r"(?<![\w/.$-])((?:adapters|gpu_backend|inspector|cli|tests|benchmarks|docs|\.ci)/[\w./-]*\w)")
DOTTED = re.compile(r"(?<![\w./])((?:radixtop\.)?(?:adapters|gpu_backend|inspector|cli)(?:\.[A-Za-z_]\w*)+)")
LEFT_AS_THEY_WERE = {
    "tests/test_dates.py",  # gpu_backend/demo_text.py: a made-up agent's tool call in the demo's text
}
OUTPUTS = "benchmarks/results/"
"""Where the benchmarks write their results (ignored by git): named, never tracked."""


def tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return [f for f in out.split() if f.endswith((".py", ".md", ".toml")) or f.startswith(".ci/")]


@cache
def resolves(dotted: str) -> bool:
    """A module, or a module's attribute (and one attribute or dataclass field of that)."""
    name = dotted if dotted.startswith("radixtop.") else f"radixtop.{dotted}"
    parts = name.split(".")
    for cut in range(len(parts), 1, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for depth, attr in enumerate(parts[cut:]):
            fields = getattr(obj, "__dataclass_fields__", {})
            if hasattr(obj, attr) or attr in fields or attr in getattr(obj, "__annotations__", {}):
                obj = getattr(obj, attr, None)
                continue
            return depth >= 2  # deeper than an attribute's attribute is not checked
        return True
    return False


def stale() -> list[str]:
    found = []
    for rel in tracked():
        text = (REPO / rel).read_text(errors="replace")
        for line_no, line in enumerate(text.splitlines(), 1):
            for match in PATH.finditer(line):
                path, after = match.group(1), line[match.end():match.end() + 2]
                if "*" in after or any(c in path for c in "*{<") or path in LEFT_AS_THEY_WERE or path.startswith(OUTPUTS.rstrip("/")):
                    continue
                if not (REPO / path).exists():
                    found.append(f"{rel}:{line_no}: path {path}")
            for dotted in DOTTED.findall(line):
                dotted = dotted.rstrip(".")
                if dotted in LEFT_AS_THEY_WERE or dotted.split(".")[-1] in ("py", "md"):
                    continue
                if not resolves(dotted):
                    found.append(f"{rel}:{line_no}: name {dotted}")
    return found


def test_every_path_and_dotted_name_mentioned_still_exists():
    assert stale() == []
