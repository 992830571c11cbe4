"""radixtop's process beside the scheduler on SGLang 0.5.16's Python ``RadixCache`` (sessions on),
issue 27's split: the probe in the "scheduler" records the tree's changes and answers SGLang's own
figures and actions (``probe.CoreOps``); ``python -m radixtop.adapters.sglang.beside``, started as the
plugin starts it, keeps the copy (``mirror``), its index and its ledger, and serves the admin API.
Its answers equal those of radixtop in SGLang's process over the same cache; a close through it
frees what its plan said; killed, it comes back with the whole tree."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import time

import pytest

from radixtop.adapters.errors import AdapterError
from radixtop.adapters.sglang.inproc import SGLangInProcessAdapter
from radixtop.gpu_backend.ledger.orders import ROW_KEYS
from tests.on_sglang.ref.replay_sglang import SGLangReplayer, _parse, import_sglang
from tests.on_sglang.test_mirror16 import node_rows, session_rows
from tests.support.scheduler_loop import SchedulerLoop
from tests.support.trace_gen import capacity_for, generate_trace

pytestmark = [pytest.mark.sglang, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def sgl():
    return import_sglang()


def started(cache, running=None, tokenizer=None):
    from radixtop.adapters.http.client import RadixtopClient
    from radixtop.adapters.http.server.run import bind
    from radixtop.adapters.sglang.probe import BesideProcess, CoreOps
    from radixtop.adapters.sglang.records import ChangeRecorder

    listening = bind("127.0.0.1", 0)
    listening.listen()
    port = listening.getsockname()[1]
    token = "a-test-token-of-enough-characters"
    ops = CoreOps(cache, "sglang dp0 (test)", None, model="tiny", running_requests=running,
                  waiting_requests=(lambda: []) if running is not None else None)
    info = {"name": "sglang dp0 (test)", "dp_rank": 0, "bytes_per_token": ops.bpt,
            "capacity_tokens": int(ops.allocator.size), "tree": "radix", "page_size": 1, "sessions": True,
            "geometry": dataclasses.asdict(ops.geometry), "tokenizer": tokenizer}
    beside = BesideProcess(cache, listening, "127.0.0.1", info, {**os.environ, "RADIXTOP_TOKEN": token},
                           sglang=ops, recorder=ChangeRecorder(cache))
    return beside, RadixtopClient(f"http://127.0.0.1:{port}", token=token, timeout=30)


def up(client, timeout: float = 30):
    deadline = time.monotonic() + timeout
    while True:
        try:
            return client.stats()
        except Exception:
            assert time.monotonic() < deadline, "radixtop's process beside did not come up"
            time.sleep(0.2)


def seven_sessions(sgl, requests, replayer=None):
    """Requests of 7 sessions (``s0``..``s6``) in a pool of 200,000 tokens: SGLang's replayer."""
    if replayer is None:
        replayer = SGLangReplayer(sgl, 200_000, eviction_policy="lru", max_running=8, max_context_len=512)
        replayer.cache.enable_session_radix_cache = True
    for n in requests:
        replayer.apply(n, {"op": "request", "input": [n % 97 + 2, n % 89 + 2, n, n + 1], "output": [7],
                           "session": f"s{n % 7}"})
    return replayer


def same_answers(loop, inproc, client, orders=ROW_KEYS) -> None:
    """Every sessions order, the root's children and the totals: beside as in process."""
    here: dict = {}
    loop.run(lambda: here.update({order: session_rows(inproc.sessions(order, 0, 100)) for order in orders},
                                 stats=inproc.stats(), kids=inproc.children(0, 0, 100)))
    for order in orders:
        assert session_rows(client.sessions(order, 0, 100)) == here[order], order
    st, kids = client.stats(), client.children(0, 0, 100)
    mine = here["stats"]
    assert (st.node_count, st.open_sessions, st.closed_sessions, st.evictable_tokens, st.protected_tokens,
            st.available_tokens, st.capacity_tokens, st.bytes_per_token) == \
        (mine.node_count, mine.open_sessions, mine.closed_sessions, mine.evictable_tokens, mine.protected_tokens,
         mine.available_tokens, mine.capacity_tokens, mine.bytes_per_token)
    assert node_rows(kids) == node_rows(here["kids"])


def test_radixtop_beside_a_python_core_answers_as_in_process_and_closes_exactly(sgl):
    lines = [line for line in generate_trace(2, n_ops=240, max_in_flight=4, vocab=400, abort_weight=3)
             if json.loads(line)["op"] not in ("register", "close")]
    replayer = SGLangReplayer(sgl, capacity_for(lines, "small"), eviction_policy="lru", max_running=8,
                              max_context_len=512)
    cache = replayer.cache
    cache.enable_session_radix_cache = True
    inproc = SGLangInProcessAdapter(cache, model="tiny")  # (the loop's thread is the scheduler's)
    beside, client = started(cache)
    loop = SchedulerLoop(beside, cache, None)
    ops = _parse(lines)
    try:
        up(client)
        for start in range(0, len(ops), 60):
            loop.run(lambda chunk=ops[start : start + 60]: [replayer.apply(n, op) for n, op in chunk])
            same_answers(loop, inproc, client)
        top = client.sessions("exclusive_bytes", 0, 3).sessions
        assert top and top[0].exclusive_bytes > 0
        for view in top:  # each close through radixtop beside: SGLang's own, and what its plan said
            row = client.session(view.id).session  # (a close before may have left it more of its own)
            plan = client.plan_close(view.id)
            assert plan.freed_bytes == row.exclusive_bytes > 0
            done = client.close_session(view.id)
            assert done.freed_bytes == plan.freed_bytes and done.freed_node_ids == plan.freed_node_ids
            same_answers(loop, inproc, client)
        assert client.evict(10**6).evicted_tokens > 0
        same_answers(loop, inproc, client)

        first = beside.child.pid  # killed: SGLang goes on, and the new process gets the whole tree
        os.kill(first, signal.SIGKILL)
        loop.run(lambda: [replayer.apply(n, op) for n, op in ops[:40]])
        deadline = time.monotonic() + 30
        while beside.child.pid == first or beside.child.poll() is not None:
            assert time.monotonic() < deadline, "radixtop's process was not started again"
            time.sleep(0.1)
        up(client)
        # (what each session last did before the restart is not in the tree: its memory is)
        same_answers(loop, inproc, client, [order for order in ROW_KEYS if order != "last_activity"])
    finally:
        loop.run(beside.close)
        loop.close()


def test_reads_while_the_whole_tree_is_on_its_way_answer_at_once_and_say_so(sgl, monkeypatch):
    """The whole tree goes a slice a scheduler step (``records.Walk``): on a big tree, seconds.
    Meanwhile a read does not wait for a sync the probe holds back until the tree is whole (it
    waited ``RADIXTOP_TIMEOUT``, 10 s, each): it answers from the copy it has, and says it is
    receiving; once whole, reads are current again."""
    from radixtop.adapters.sglang import probe as probe_module

    monkeypatch.setattr(probe_module, "SNAPSHOT_NODES", 50)  # (a few slices: the scheduler is not stepped yet)
    replayer = seven_sessions(sgl, range(1, 600))
    cache = replayer.cache
    inproc = SGLangInProcessAdapter(cache, model="tiny")
    beside, client = started(cache)
    loop = None
    try:
        assert beside.probe.busy
        deadline = time.monotonic() + 30
        while True:  # (radixtop's process starting)
            try:
                began = time.monotonic()
                caps = client.capabilities()
                took = time.monotonic() - began
                break
            except Exception:
                assert time.monotonic() < deadline, "radixtop's process beside did not come up"
                time.sleep(0.2)
        assert "receiving" in (caps.reason or ""), caps.reason
        assert took < 3, f"a read waited {took:.1f} s for the whole tree"
        began = time.monotonic()
        try:
            client.stats()
        except AdapterError as exc:  # (at its start SGLang's totals have not come yet: said in one line)
            assert "has not answered" in str(exc)
        assert time.monotonic() - began < 3
        loop = SchedulerLoop(beside, cache, None)
        deadline = time.monotonic() + 30
        while beside.probe.busy or "receiving" in (client.capabilities().reason or ""):
            assert time.monotonic() < deadline, "the whole tree did not come"
            time.sleep(0.1)
        here: list = []
        loop.run(lambda: here.append(inproc.stats().node_count))
        assert client.stats().node_count == here[0] > 600
    finally:
        if loop is not None:
            loop.run(beside.close)
            loop.close()
        else:
            beside.close()


def test_the_doctor_beside_checks_the_locks_against_the_requests_of_the_same_step(sgl):
    """The doctor in radixtop's process: SGLang's running requests (their locked nodes) as of one
    scheduler step, checked against the copy's locks as of that same step: requests that hold
    locks are no leak; a lock nobody holds is one."""
    replayer = SGLangReplayer(sgl, 4096, eviction_policy="lru", max_running=8, max_context_len=512)
    cache = replayer.cache
    cache.enable_session_radix_cache = True
    beside, client = started(cache, running=lambda: list(replayer.running.values()))
    loop = SchedulerLoop(beside, cache, None)
    try:
        up(client)
        for n in range(6):  # served, then three running (their prefixes locked)
            loop.run(lambda n=n: replayer.apply(n, {"op": "request", "input": [3, 4, 5, n + 10, n + 11],
                                                    "output": [7], "session": f"s{n}"}))
        for n in range(3):
            loop.run(lambda n=n: replayer.apply(10 + n, {"op": "begin", "id": f"r{n}", "input": [3, 4, 5, n + 10, 99],
                                                         "session": f"s{n}"}))
        found = client.diagnose()
        assert found.healthy, [f.summary for f in found.findings]
        assert "leaked_lock" in found.checked
        loop.run(lambda: cache.inc_lock_ref(next(iter(cache.root_node.children.values()))))  # nobody's lock
        found = client.diagnose()
        assert [f.kind for f in found.findings] == ["leaked_lock"]
    finally:
        loop.run(beside.close)
        loop.close()


def words_tokenizer(folder):
    """A word-level tokenizer of 1,000 ids saved as a model's (``w5`` is id 5)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel({"[UNK]": 0, **{f"w{i}": i for i in range(1, 1000)}}, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=words, unk_token="[UNK]").save_pretrained(str(folder))
    return str(folder)


@pytest.mark.parametrize("loads", [True, False])
def test_the_process_beside_loads_the_servers_tokenizer_for_its_previews(sgl, tmp_path, loads):
    """The hello says where the scheduler's tokenizer came from; radixtop's process loads it (from
    local files) and its previews carry the same text as radixtop's in SGLang's process. One that
    does not load there leaves token ids, no text, and the process serves on."""
    from transformers import AutoTokenizer

    path = words_tokenizer(tmp_path / "words")
    replayer = SGLangReplayer(sgl, 4096, eviction_policy="lru", max_running=8, max_context_len=512)
    cache = replayer.cache
    cache.enable_session_radix_cache = True
    inproc = SGLangInProcessAdapter(cache, model="tiny", tokenizer=AutoTokenizer.from_pretrained(path))
    beside, client = started(cache, tokenizer={"path": path if loads else str(tmp_path / "nothing here")})
    loop = SchedulerLoop(beside, cache, None)
    try:
        up(client)
        for n in range(4):
            loop.run(lambda n=n: replayer.apply(n, {"op": "request", "input": [3, 4, 5, n + 10, n + 11],
                                                    "output": [7], "session": f"s{n}"}))
        here: dict = {}
        loop.run(lambda: here.update(kids=inproc.children(0, 0, 100)))
        want = [(v.id, v.text) for v in here["kids"].children]
        assert want and all(text for _, text in want)
        deadline = time.monotonic() + 60
        while True:
            got = [(v.id, v.text) for v in client.children(0, 0, 100).children]
            if got == want or not loads and time.monotonic() > deadline - 50:
                break
            assert time.monotonic() < deadline, got
            time.sleep(0.2)
        if not loads:
            assert [text for _, text in got] == [None] * len(want)
            assert [v.id for v in client.children(0, 0, 100).children] == [i for i, _ in want]
    finally:
        loop.run(beside.close)
        loop.close()


def test_evict_and_flush_are_answered_while_the_whole_tree_is_on_its_way_and_a_close_is_refused_at_once(
        sgl, monkeypatch):
    """At 1M nodes the whole tree takes 60-95 s to come (a restart of radixtop's process, a
    resync). An operator's evict or flush does not need radixtop's copy: SGLang runs it between
    its steps at once (it waited for the whole tree, past its 10 s timeout). A close's plan needs
    the whole copy: refused at once in one line (it was planned on the copy in the making: a real
    session unknown), and once the tree is whole it closes as planned."""
    from radixtop.adapters.sglang import probe as probe_module

    hold = {"on": False}
    stream = probe_module.RecordsProbe.stream

    def held(self):  # the walk stays on its way while the test holds it
        if not hold["on"]:
            stream(self)

    monkeypatch.setattr(probe_module.RecordsProbe, "stream", held)
    monkeypatch.setattr(probe_module, "SNAPSHOT_NODES", 20)
    replayer = seven_sessions(sgl, range(1, 600))
    cache = replayer.cache
    inproc = SGLangInProcessAdapter(cache, model="tiny")
    beside, client = started(cache)
    loop = SchedulerLoop(beside, cache, None)
    try:
        up(client)
        hold["on"] = True
        loop.run(lambda: beside.probe.start())  # (a resync: the whole tree again, held mid-way)
        loop.run(lambda: stream(beside.probe))  # (its first slices out)
        deadline = time.monotonic() + 30
        while "receiving" not in (client.capabilities().reason or ""):
            assert time.monotonic() < deadline, "radixtop's process did not begin receiving the whole tree"
            time.sleep(0.05)
        assert beside.probe.busy

        began = time.monotonic()
        evicted = client.evict(40).evicted_tokens
        took = time.monotonic() - began
        assert evicted >= 40 and took < 3, (evicted, took)
        began = time.monotonic()
        flushed = client.flush()
        assert flushed.freed_tokens > 0 and time.monotonic() - began < 3
        began = time.monotonic()
        with pytest.raises(AdapterError) as refused:
            client.close_session("s3")
        assert refused.value.code == "not_ready" and time.monotonic() - began < 3
        assert "whole tree" in str(refused.value) and "\n" not in str(refused.value)
        with pytest.raises(AdapterError) as refused:
            client.plan_close("s3")
        assert refused.value.code == "not_ready"
        assert beside.probe.busy  # (all of it while the tree was still on its way)
        loop.run(lambda: seven_sessions(sgl, range(600, 700), replayer))

        hold["on"] = False
        deadline = time.monotonic() + 30
        while beside.probe.busy or "receiving" in (client.capabilities().reason or ""):
            assert time.monotonic() < deadline, "the whole tree did not come"
            time.sleep(0.1)
        same_answers(loop, inproc, client, [order for order in ROW_KEYS if order != "last_activity"])
        plan = client.plan_close("s3")
        done = client.close_session("s3")
        assert done.freed_tokens == plan.freed_tokens > 0 and done.freed_node_ids == plan.freed_node_ids
    finally:
        loop.run(beside.close)
        loop.close()


def test_a_process_beside_that_exits_at_each_start_is_given_up_and_said_so(sgl, monkeypatch):
    """A process beside that exits before it is up (an import error, a bad setting) was started
    again forever, each start walking the whole tree on the scheduler's thread. After
    ``START_TRIES`` such starts in a row the probe gives up and says why in one line (the plugin
    then stops radixtop, SGLang goes on: ``plugin._beside_step``)."""
    from radixtop.adapters.sglang import probe as probe_module

    monkeypatch.setattr(probe_module, "RESTART_FIRST_S", 0.01)
    monkeypatch.setattr(probe_module, "RESTART_MOST_S", 0.02)
    monkeypatch.setattr(probe_module, "LOOK_S", 0.01)
    monkeypatch.setenv("RADIXTOP_BESIDE_CPU", "a lot")  # (radixtop's process refuses it at its start)
    replayer = SGLangReplayer(sgl, 20_000, eviction_policy="lru", max_running=8, max_context_len=512)
    beside, _ = started(replayer.cache)
    try:
        deadline = time.monotonic() + 60
        with pytest.raises(RuntimeError) as gave_up:
            while True:
                beside.step()
                assert time.monotonic() < deadline, f"not given up after {beside.starts} starts"
                time.sleep(0.005)
        assert beside.starts == probe_module.START_TRIES
        message = str(gave_up.value)
        assert "\n" not in message and f"{probe_module.START_TRIES} times in a row" in message, message
        assert "exit 1" in message, message
    finally:
        beside.close()
