"""The commands against a live `radixtop serve` whose tree keeps changing (the demo workload on a
small cache, evicting all the time), run as a user runs them: `radixtop ...` in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from radixtop.cli.embedded import demo_server


@pytest.fixture(scope="module")
def live():
    with demo_server("live demo · tiny", "tiny", 2048, 24, 7, 100.0) as (url, token):
        yield url, token


def radixtop(live, *args: str) -> subprocess.CompletedProcess:
    url, token = live
    env = {**os.environ, "RADIXTOP_URL": url, "RADIXTOP_TOKEN": token}
    return subprocess.run([sys.executable, "-P", "-m", "radixtop.cli.main", *args], env=env,
                          capture_output=True, text=True, timeout=60)


def test_tree_is_one_moment_of_a_changing_tree(live):
    """Each `radixtop tree` is the tree at one moment: it never fails for a node that went away
    between two of its reads, and no child is larger than its parent."""
    def check(doc: dict) -> int:
        parent = doc["node"]
        for child in doc["children"]:
            assert child["node"]["parent_id"] == parent["id"]
            assert child["node"]["subtree_bytes"] <= parent["subtree_bytes"], (child["node"], parent)
        assert doc["more"] >= 0
        return 1 + sum(check(c) for c in doc["children"])

    shown = 0
    for _ in range(12):
        done = radixtop(live, "tree", "--depth", "6", "--limit", "8", "--json")
        assert done.returncode == 0, done.stderr
        shown += check(json.loads(done.stdout))
    assert shown > 12 * 2  # there was a tree to read
    text = radixtop(live, "tree")
    assert text.returncode == 0 and "root" in text.stdout, text.stderr
