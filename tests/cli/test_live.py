"""The commands against a live `radixtop serve` whose tree keeps changing (the demo workload on a
small cache, evicting all the time), run as a user runs them: `radixtop ...` in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from radixtop.adapters.http.client import RadixtopClient
from radixtop.cli.embedded import demo_server


@pytest.fixture(scope="module")
def live():
    with demo_server("live demo · tiny", "tiny", 16384, 24, 7, 50.0) as child:
        url, token = child.url, child.token
        client = RadixtopClient(url, token=token, timeout=10)
        deadline = time.monotonic() + 60
        while (client.stats().node_count or 0) < 40 or client.stats().evicted_tokens == 0:  # full, and evicting
            assert time.monotonic() < deadline, client.stats()
            time.sleep(0.2)
        client.release()
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
    assert shown > 12 * 3  # there was a tree to read
    text = radixtop(live, "tree")
    assert text.returncode == 0 and "root" in text.stdout, text.stderr


def test_sessions_figures_are_fresh_and_say_how_old(live):
    """On a cache that changes all the time every read's figures and ranking are as of that read
    (kept with the tree), and the title says so."""
    for _ in range(4):
        done = radixtop(live, "sessions", "--json")
        assert done.returncode == 0, done.stderr
        page = json.loads(done.stdout)
        assert page["sessions"]
        assert page["figures_current"] and page["figures_age_s"] == 0.0 and not page["refreshing"]
    text = radixtop(live, "sessions")
    assert text.returncode == 0 and "figures current" in text.stdout, text.stdout


def test_sessions_sort_and_filter_run_over_all_of_a_live_servers_sessions(live):
    """On a server whose sessions come and go: a filter keeps only matching ids and says how many
    there are in all; an order read from its other end is that order reversed."""
    done = radixtop(live, "sessions", "--filter", "s1", "--limit", "10000", "--json")
    assert done.returncode == 0, done.stderr
    page = json.loads(done.stdout)
    assert page["sessions"] and all("s1" in s["id"] for s in page["sessions"])
    assert page["total"] == len(page["sessions"]) <= page["all_sessions"] and page["contains"] == "s1"
    done = radixtop(live, "sessions", "--sort", "id", "--reverse", "--limit", "10000", "--json")
    ids = [s["id"] for s in json.loads(done.stdout)["sessions"]]
    assert ids == sorted(ids, reverse=True) and len(ids) == json.loads(done.stdout)["all_sessions"]


def test_a_reader_that_closes_the_pipe_ends_the_command_quietly(live):
    """`radixtop export | head -1`: the reader goes away; the command ends quietly with 0, as
    `git` and `ls` do (it exited 1 with an empty stderr)."""
    url, token = live
    env = {**os.environ, "RADIXTOP_URL": url, "RADIXTOP_TOKEN": token}
    for args in (["export"], ["tree", "--depth", "8"], ["sessions", "--limit", "500"]):
        child = subprocess.Popen([sys.executable, "-P", "-m", "radixtop.cli.main", *args], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        child.stdout.close()  # the reader is gone before the first line
        _, err = child.communicate(timeout=60)
        assert child.returncode == 0 and err == b"", (args, child.returncode, err)


def test_tree_shows_a_line_break_in_text_as_the_dashboard_does(live):
    """The demo's text has line breaks: `radixtop tree` shows them as ⏎ (it showed '?', which
    also stands for a control code)."""
    done = radixtop(live, "tree", "--depth", "12", "--limit", "50")
    assert done.returncode == 0, done.stderr
    assert "<|end|>⏎" in done.stdout and "<|end|>?" not in done.stdout  # each turn ends on a line break


def test_close_of_an_unknown_session_is_the_error_alone(live):
    """`close nosuch --dry-run` printed an empty plan table before its error."""
    for args in (["close", "nosuch", "--dry-run"], ["close", "nosuch", "--yes"]):
        done = radixtop(live, *args)
        assert done.returncode == 1 and done.stdout == "", (args, done.stdout)
        assert done.stderr == "radixtop: session 'nosuch' is not known\n"


@pytest.mark.parametrize("args, says", [
    (["match", "1,,2"], "empty token id"),
    (["match", "1,2,"], "empty token id"),
    (["evict", "0", "--dry-run"], "greater than or equal to 1"),
    (["evict", "0", "--yes"], "greater than or equal to 1"),
])
def test_an_empty_token_or_a_zero_evict_is_a_usage_error(live, args, says):
    done = radixtop(live, *args)
    assert done.returncode == 2 and done.stdout == "", (done.stdout, done.stderr)
    assert len(done.stderr.splitlines()) == 1 and says in done.stderr, done.stderr


def test_stats_title_names_the_model_once(live):
    done = radixtop(live, "stats")
    assert done.returncode == 0, done.stderr
    title = " ".join(done.stdout.split("┏")[0].split())
    assert title.count("tiny") == 1, title
