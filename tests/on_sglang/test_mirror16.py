"""The mirror beside the scheduler (issue 27, the Python cores): the REAL SGLang 0.5.16 RadixCache
(sessions on) driven through SGLang's own request paths (splits, evictions under pressure, aborts,
closes, a reset), its change records taken by the probe's recorder, sent through msgpack as the
hand-over carries them and applied to a ``MirrorCache``; after every operation the mirror equals
SGLang's tree field for field, and radixtop's adapter over the mirror (its index and ledger, as
beside the scheduler) answers what the adapter in SGLang's process answers."""

from __future__ import annotations

import dataclasses
import json

import msgspec
import pytest

from radixtop.adapters.sglang.inproc import SGLangInProcessAdapter
from radixtop.adapters.sglang.mirror import MirrorCache
from radixtop.adapters.sglang.records import ChangeRecorder
from radixtop.gpu_backend.ledger.orders import ROW_KEYS
from tests.on_sglang.ref.replay_sglang import SGLangReplayer, _parse, import_sglang
from tests.on_sglang.test_ledger16 import check_kept
from tests.support.trace_gen import capacity_for, generate_trace


@pytest.fixture(scope="module")
def sgl():
    return import_sglang()


def walk(root):
    out, stack = {}, [root]
    while stack:
        node = stack.pop()
        out[node.id] = node
        stack.extend(node.children.values())
    return out


def check_same(cache, mirror: MirrorCache, tokens=lambda node: list(node.key.token_ids), bundled: bool = False) -> None:
    """``mirror`` equal to ``cache`` field for field; ``tokens``: a node's token ids in ``cache``;
    ``bundled``: radixtop's own cache (no extra key; its creation times are compared too)."""
    real, mine = walk(cache.root_node), walk(mirror.root_node)
    assert set(real) == set(mine)
    assert set(mine) == set(mirror.by_id)
    for node_id, node in real.items():
        copy = mine[node_id]
        if node is cache.root_node:
            assert copy is mirror.root_node
            continue
        assert copy.parent.id == node.parent.id, node_id
        assert list(copy.key.token_ids) == tokens(node), node_id
        if bundled:
            assert copy.creation_time == node.creation_time, node_id
        else:
            assert copy.key.extra_key == node.key.extra_key
        assert set(copy.children) == set(node.children), node_id
        assert copy.lock_ref == node.lock_ref, node_id
        assert copy.hit_count == node.hit_count, node_id
        assert (copy.session_ids or set()) == (getattr(node, "session_ids", None) or set()), node_id
        assert copy.last_access_time == node.last_access_time, node_id
    assert {sid: {n.id for n in nodes} for sid, nodes in mirror._session_leaves.items()} == \
        {sid: {n.id for n in nodes} for sid, nodes in cache._session_leaves.items()}
    assert list(mirror._closed_session_ids) == list(cache._closed_session_ids)
    assert (mirror.evictable_size(), mirror.protected_size()) == (cache.evictable_size(), cache.protected_size())


def wire(records: list) -> list:
    """Through the hand-over's encoding (the probe's encoder, the mirror's decoder)."""
    return msgspec.msgpack.decode(msgspec.msgpack.encode(records))


def session_rows(page):
    """A sessions page's total and rows, each read's own age of the last activity aside (two reads
    are a moment apart)."""
    return page.total, [dataclasses.replace(v, last_activity_age_s=None) for v in page.sessions]


def node_rows(page):
    """A children page's nodes as the figures both places must agree on."""
    return [(v.id, v.tokens, v.subtree_tokens, v.lock_ref, v.hit_count, v.holders) for v in page.children]


def check_reads(inproc: SGLangInProcessAdapter, beside: SGLangInProcessAdapter, orders=ROW_KEYS) -> None:
    for order in orders:
        a, b = inproc.sessions(order, 0, 50), beside.sessions(order, 0, 50)
        assert session_rows(a) == session_rows(b), order
    for sid in [row.id for row in inproc.sessions("exclusive_bytes", 0, 20).sessions]:
        a, b = inproc.plan_close(sid), beside.plan_close(sid)
        # (the order SGLang's close visits a session's leaves is its set's, of its own nodes)
        same = lambda p: dataclasses.replace(  # noqa: E731
            p, freed_node_ids=sorted(p.freed_node_ids), kept=sorted(p.kept, key=lambda k: k.node_id))
        assert same(a) == same(b)
    a, b = inproc.children(0, 0, 50), beside.children(0, 0, 50)
    assert (a.total, node_rows(a)) == (b.total, node_rows(b))


def recorded(sgl, lines: list[str], size: str):
    """SGLang's cache (sessions on) for ``lines`` in a ``size`` pool, radixtop in process over it,
    the probe's recorder on it and an empty copy: ``(replayer, cache, inproc, recorder, mirror)``."""
    replayer = SGLangReplayer(sgl, capacity_for(lines, size), eviction_policy="lru", max_running=8,
                              max_context_len=512)
    cache = replayer.cache
    cache.enable_session_radix_cache = True
    return replayer, cache, SGLangInProcessAdapter(cache, model="tiny"), ChangeRecorder(cache), MirrorCache(page_size=1)


@pytest.mark.parametrize("size", ["small", "large"])
@pytest.mark.parametrize("seed", range(6))
def test_the_mirror_follows_every_operation(sgl, seed, size):
    lines = generate_trace(seed, n_ops=150, max_in_flight=4, vocab=6 if seed % 2 else 400, abort_weight=3)
    # (a tombstone dropped by hand, the replayer's "register", is no path of SGLang 0.5.16's)
    lines = [line for line in lines if json.loads(line)["op"] != "register"]
    replayer, cache, inproc, recorder, mirror = recorded(sgl, lines, size)
    mirror.apply(wire(recorder.snapshot()))
    beside = SGLangInProcessAdapter(mirror, model="tiny")
    beside.bpt = inproc.bpt
    beside._orders.bpt = inproc.bpt
    kinds = set()
    for line_no, op in _parse(lines):
        replayer.apply(line_no, op)
        records = recorder.take()
        kinds |= {r[0] for r in records}
        mirror.apply(wire(records))
        check_same(cache, mirror)
        check_kept(mirror, beside)
        check_reads(inproc, beside)
    assert replayer.counters["splits"] > 0 or seed % 2 == 0
    assert len(kinds) >= 8, kinds
    cache.reset()
    mirror.apply(wire(recorder.take()))
    check_same(cache, mirror)


def running_cache(sgl, seed: int, n_ops: int, vocab: int):
    """A cache 100 operations into a trace (radixtop's process (re)started with requests
    running): the replayer, its cache, the operations left."""
    lines = generate_trace(seed, n_ops=n_ops, max_in_flight=4, vocab=vocab, abort_weight=3)
    lines = [line for line in lines if json.loads(line)["op"] != "register"]
    replayer = SGLangReplayer(sgl, capacity_for(lines, "small"), eviction_policy="lru", max_running=8,
                              max_context_len=512)
    replayer.cache.enable_session_radix_cache = True
    ops = _parse(lines)
    for line_no, op in ops[:100]:
        replayer.apply(line_no, op)
    return replayer, replayer.cache, ops[100:]


def test_a_mirror_made_from_a_snapshot_of_a_running_cache_equals_it(sgl):
    replayer, cache, ops = running_cache(sgl, 3, 150, 6)
    recorder = ChangeRecorder(cache)
    mirror = MirrorCache(page_size=1)
    snapshot = wire(recorder.snapshot())
    mirror.apply(snapshot[:-1])
    assert mirror.receiving  # (until the snapshot's last record: part of the tree)
    mirror.apply(snapshot[-1:])
    assert not mirror.receiving
    check_same(cache, mirror)
    for line_no, op in ops:
        replayer.apply(line_no, op)
        mirror.apply(wire(recorder.take()))
        check_same(cache, mirror)


@pytest.mark.parametrize("sliced", [1, 3])
def test_a_whole_tree_walked_in_slices_while_sglang_changes_it_comes_equal(sgl, sliced):
    """The whole tree sent over many steps (issue 27: no step holds the scheduler for a whole
    tree's walk) while SGLang's requests, aborts, evictions and closes go on between its slices:
    once whole, the copy equals SGLang's tree field for field, its ledger the from-scratch
    attribution, its reads those of radixtop attached in SGLang's process when the walk began;
    then it follows the records."""
    from radixtop.adapters.owned.records import BEGIN, DROP, NODE, SEEN, WHOLE, Walk

    kinds = set()
    for seed in range(6):
        replayer, cache, ops = running_cache(sgl, 10 + seed, 220, 6 if seed % 2 else 400)
        inproc = SGLangInProcessAdapter(cache, model="tiny")
        recorder = ChangeRecorder(cache)
        mirror = MirrorCache(page_size=1)
        beside = SGLangInProcessAdapter(mirror, model="tiny")  # (reading its copy from the start)
        beside.bpt = inproc.bpt
        beside._orders.bpt = inproc.bpt
        walk = Walk(recorder)
        for line_no, op in ops:
            replayer.apply(line_no, op)
            whole = walk.done
            records = walk.step(most=sliced) if not whole else recorder.take()
            kinds |= {r[0] for r in records}
            mirror.apply(wire(records))
            if not walk.done:
                assert mirror.receiving
                continue
            check_same(cache, mirror)
            check_kept(mirror, beside)
            if not whole:  # it came whole now
                check_seen(cache, walk, inproc, beside)
            check_reads(inproc, beside, [order for order in ROW_KEYS if order != "last_activity"])
        assert walk.done, "the walk did not end within the trace"
    assert {BEGIN, NODE, WHOLE, SEEN, DROP} <= kinds, kinds


def check_seen(cache, walk, inproc, beside) -> None:
    """Each session's last activity as the copy tells it once whole: a session active during the
    walk (one of its requests ended, it closed) when it was, as in SGLang's process; any other as
    its newest tagged node's last access at the walk's end (SGLang 0.5.16 stamps nodes with
    ``time.monotonic()``: what radixtop in SGLang's process reads at its attach, read here at the
    moment the copy came whole)."""
    mine, theirs = beside._index.ledger.seen, inproc._index.ledger.seen
    active = list(walk.seen)
    assert set(active) <= set(theirs)
    assert sorted(active, key=mine.__getitem__) == sorted(active, key=theirs.__getitem__)
    leaves = {sid: max(node.last_access_time for node in nodes) for sid, nodes in cache._session_leaves.items()
              if nodes and sid not in walk.seen}
    assert {sid: t for sid, t in mine.items() if sid not in walk.seen} == leaves


def test_a_prompt_longer_than_a_frame_goes_in_parts_and_comes_out_whole(sgl):
    from radixtop.adapters.owned.records import ADD, split_long

    replayer = SGLangReplayer(sgl, 4096, eviction_policy="lru", max_running=8, max_context_len=4096)
    cache = replayer.cache
    cache.enable_session_radix_cache = True
    recorder = ChangeRecorder(cache)
    mirror = MirrorCache(page_size=1)
    mirror.apply(wire(recorder.snapshot()))
    replayer.apply(1, {"op": "request", "input": list(range(1, 3000)), "output": [7, 8], "session": "long"})
    records = recorder.take()
    parted = [part for record in records for part in split_long(record, 1000)]
    assert len(parted) > len(records) + 20
    assert all(len(p[3]) <= 1000 for p in parted if p[0] == ADD)
    for part in parted:
        mirror.apply(wire([part]))
    check_same(cache, mirror)


def test_the_whole_tree_goes_as_the_socket_takes_it_and_nothing_is_dropped(sgl):
    """radixtop's process (re)started on a grown tree: the whole tree's records, taken in one walk,
    go a few frames a step as the socket takes them, never more than one into the backlog, the
    requests meanwhile after them; over a 4 KiB socket, with radixtop's side reading only now and
    then, no frame is dropped and the mirror ends equal to SGLang's tree."""
    import random

    from radixtop.adapters.sglang.probe import RECORDS, RecordsProbe
    from radixtop.gpu_backend.owner.handover import MirrorEnd, ProbeEnd, pair

    replayer = SGLangReplayer(sgl, 200_000, eviction_policy="lru", max_running=8, max_context_len=4096)
    cache = replayer.cache
    cache.enable_session_radix_cache = True
    rng = random.Random(9)
    base = [rng.randrange(2, 30_000) for _ in range(60)]

    def request(n: int) -> None:
        prompt = base[: rng.randrange(1, 60)] + [rng.randrange(2, 30_000) for _ in range(rng.randrange(2, 40))]
        replayer.apply(n, {"op": "request", "input": prompt, "output": [7], "session": f"s{n % 40}"})

    for n in range(1500):
        request(n)
    probe_sock, mirror_sock = pair(4 << 10)
    probe = RecordsProbe(ChangeRecorder(cache), ProbeEnd(probe_sock, backlog_bytes=1 << 20))
    end = MirrorEnd(mirror_sock)
    mirror = MirrorCache(page_size=1)
    probe.start()
    assert probe.busy
    most_held = 0
    frames = 0
    for k in range(300):
        request(2000 + k)
        probe.step()
        if probe.busy:
            most_held = max(most_held, probe.end.held)
        if k % 3 == 0:  # radixtop's side reads now and then
            while (frame := end.receive(0)) is not None:
                assert frame.kind == RECORDS and not frame.lost
                mirror.apply(msgspec.msgpack.decode(frame.payload))
                frames += 1
    while probe.busy or probe.recorder.records or probe.end.held:
        probe.step(now=True)
        while (frame := end.receive(0)) is not None:
            assert not frame.lost
            mirror.apply(msgspec.msgpack.decode(frame.payload))
            frames += 1
    assert probe.end.dropped == 0 and frames > 10
    assert most_held <= probe.end.frame_max + 64  # (one frame and its header at most)
    assert not mirror.receiving
    check_same(cache, mirror)


def test_a_hook_that_cannot_record_never_fails_sglangs_own_call(sgl, monkeypatch):
    """A recorder's hook that raises (a key it cannot read): SGLang's request goes through as if
    radixtop were not there, the recorder records nothing from then on and says why, and the
    probe's next step raises it (the plugin then stops radixtop's process; SGLang goes on)."""
    from radixtop.adapters.sglang import records

    replayer = SGLangReplayer(sgl, 4096, eviction_policy="lru", max_running=8, max_context_len=512)
    cache = replayer.cache
    cache.enable_session_radix_cache = True
    recorder = ChangeRecorder(cache)
    replayer.apply(1, {"op": "request", "input": [5, 6, 7, 8], "output": [9], "session": "a"})

    def unreadable(key):
        raise TypeError("a key radixtop cannot read")

    monkeypatch.setattr(records, "tokens_of", unreadable)
    result = replayer.apply(2, {"op": "request", "input": [1, 2, 3, 4, 5], "output": [9], "session": "b"})
    assert result["op"] == "request"
    assert cache.match_prefix(sgl.MatchPrefixParams(key=sgl.RadixKey(__import__("array").array("q", [1, 2, 3, 4, 5])))
                              ).device_indices.numel() == 5  # SGLang cached it
    assert recorder.failed is not None and "TypeError" in recorder.failed
    recorder.take()
    replayer.apply(3, {"op": "request", "input": [7, 7, 7], "output": [9], "session": "c"})
    assert recorder.take() == []


def test_the_recorder_takes_only_sglangs_own_radix_cache(sgl):
    """Found by review: a cache SGLang wraps (0.5.16's ``StreamingSession`` forwards to its inner
    ``RadixCache``, whose own calls then go unrecorded) or another tree (SWA, Mamba: other fields,
    other returns) is refused, and radixtop stays in process there, rather than a copy that
    diverges at each request."""
    from radixtop.adapters.sglang.records import can_record

    replayer = SGLangReplayer(sgl, 4096, eviction_policy="lru", max_running=8, max_context_len=512)

    class Wrapper:  # as StreamingSession: its own class, the rest forwarded to the inner cache
        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

    assert can_record(replayer.cache) is None
    assert can_record(Wrapper(replayer.cache)) is not None


def test_with_sessions_off_the_mirror_tags_nothing_sglang_does_not(sgl):
    """Found by review: with ``--enable-session-radix-cache`` off SGLang's tag is a no-op; the
    mirror's too (a session's request still records where it ended)."""
    lines = [line for line in generate_trace(4, n_ops=120, max_in_flight=4, vocab=400, abort_weight=3)
             if json.loads(line)["op"] not in ("register", "close")]
    replayer = SGLangReplayer(sgl, capacity_for(lines, "small"), eviction_policy="lru", max_running=8,
                              max_context_len=512)
    cache = replayer.cache
    cache.enable_session_radix_cache = False
    recorder = ChangeRecorder(cache)
    mirror = MirrorCache(page_size=1, sessions=False)
    mirror.apply(wire(recorder.snapshot()))
    for line_no, op in _parse(lines):
        replayer.apply(line_no, op)
        mirror.apply(wire(recorder.take()))
    check_same(cache, mirror)
    assert not mirror._session_leaves


def test_one_long_prompt_does_not_shrink_every_later_frame_of_the_whole_tree(sgl):
    """Found by review: the records a frame of the whole tree only ever halved, so one long prompt
    left every later frame (and every later snapshot) at one record: a 1M-node tree in a million
    frames, a scheduler loop per 32 of them."""
    import random

    from radixtop.adapters.sglang.probe import RecordsProbe
    from radixtop.gpu_backend.owner.handover import MirrorEnd, ProbeEnd, pair

    replayer = SGLangReplayer(sgl, 400_000, eviction_policy="lru", max_running=8, max_context_len=200_000)
    cache = replayer.cache
    cache.enable_session_radix_cache = True
    rng = random.Random(4)
    replayer.apply(0, {"op": "request", "input": [rng.randrange(2, 30_000) for _ in range(150_000)], "output": [7],
                       "session": "long"})
    for n in range(1, 3000):
        replayer.apply(n, {"op": "request", "input": [rng.randrange(2, 30_000) for _ in range(20)], "output": [7],
                           "session": f"s{n % 50}"})
    probe_sock, mirror_sock = pair()
    probe = RecordsProbe(ChangeRecorder(cache), ProbeEnd(probe_sock))
    end = MirrorEnd(mirror_sock)
    mirror = MirrorCache(page_size=1)
    for _ in range(2):  # a start, then a resync: each as few frames as the records allow
        probe.start()
        frames = 0
        while probe.busy:
            probe.step()
            while (frame := end.receive(0)) is not None:
                mirror.apply(msgspec.msgpack.decode(frame.payload))
                frames += 1
        while (frame := end.receive(0)) is not None:
            mirror.apply(msgspec.msgpack.decode(frame.payload))
            frames += 1
        records = len(probe.recorder.snapshot())
        assert frames < records / 20, (frames, records)
        check_same(cache, mirror)


def test_an_eviction_or_close_over_a_frame_goes_in_parts_to_the_same_tree(sgl):
    """Found by review: only an ``ADD`` was split; an eviction of thousands of leaves (a flush of
    a big tree) or a close of a session holding many was one record over a frame, dropped, and
    the copy resynced. Now in parts, applied in order to the same tree."""
    import random

    from radixtop.adapters.owned.records import CLOSE, EVICT, split_long

    replayer = SGLangReplayer(sgl, 200_000, eviction_policy="lru", max_running=8, max_context_len=512)
    cache = replayer.cache
    cache.enable_session_radix_cache = True
    recorder = ChangeRecorder(cache)
    mirror = MirrorCache(page_size=1)
    mirror.apply(wire(recorder.snapshot()))
    rng = random.Random(2)
    for n in range(3000):
        replayer.apply(n, {"op": "request", "input": [rng.randrange(2, 30_000) for _ in range(12)], "output": [7],
                           "session": "many" if n % 2 else f"s{n}"})
    mirror.apply(wire(recorder.take()))
    replayer.apply(9000, {"op": "close", "session": "many"})
    replayer.apply(9001, {"op": "evict", "tokens": 10_000})
    records = recorder.take()
    assert {r[0] for r in records} >= {CLOSE, EVICT}
    parted = [part for record in records for part in split_long(record, 400)]
    assert len(parted) > len(records) + 10
    for part in parted:
        assert len(msgspec.msgpack.encode(part)) <= 400 + 64
        mirror.apply(wire([part]))
    check_same(cache, mirror)


@pytest.mark.parametrize("bound", ["frames", "changes"])
def test_what_piles_up_behind_a_slow_whole_tree_stops_radixtops_process(sgl, monkeypatch, bound):
    """Found by review: while the whole tree is on its way what waits for radixtop's process stays
    in the scheduler's process: its frames, and the changes SGLang makes once it is walked. Past
    ``PENDING_BYTES`` of the one or ``PENDING_MOST`` of the other the probe gives the process up
    (it is started again later): the scheduler's memory stays bounded."""
    from radixtop.adapters.sglang import probe as probe_module
    from radixtop.adapters.sglang.probe import RecordsProbe
    from radixtop.gpu_backend.owner.handover import ProbeEnd, pair

    monkeypatch.setattr(probe_module, "SNAPSHOT_STEP_S", 10.0)  # (the walk in the first step: all of it waits)
    monkeypatch.setattr(probe_module, "PENDING_BYTES", (16 << 10) if bound == "frames" else 1 << 30)
    monkeypatch.setattr(probe_module, "PENDING_MOST", 50 if bound == "changes" else 1 << 30)
    replayer = SGLangReplayer(sgl, 200_000, eviction_policy="lru", max_running=8, max_context_len=512)
    cache = replayer.cache
    cache.enable_session_radix_cache = True
    for n in range(2000):
        replayer.apply(n, {"op": "request", "input": [n % 97 + 2, n % 89 + 2, n, n + 1], "output": [7], "session": "a"})
    probe_sock, mirror_sock = pair(4 << 10)
    probe = RecordsProbe(ChangeRecorder(cache), ProbeEnd(probe_sock, backlog_bytes=4 << 10))
    probe.start()  # nobody reads the other end: the tree stays on its way
    for n in range(2000, 2100):
        replayer.apply(n, {"op": "request", "input": [5, n, n + 1], "output": [7], "session": "b"})
        probe.step()
        assert probe.end.down or (len(probe.recorder.records) <= probe_module.PENDING_MOST + 20 and
                                  probe._out_bytes <= probe_module.PENDING_BYTES)
    assert probe.end.down and not probe.busy
    mirror_sock.close()


def test_a_copy_stays_incomplete_until_a_whole_tree_sent_after_its_ask_comes(sgl):
    """Found by review: a copy that found itself unlike SGLang's tree took any later reset (a
    flush's, or the end of a snapshot already on its way) for the whole tree it asked for."""
    from radixtop.adapters.owned.records import ADD, RESET, WHOLE
    from radixtop.adapters.sglang.probe import RECORDS
    from radixtop.gpu_backend.owner.handover import ProbeEnd, pair

    probe_sock, mirror_sock = pair()
    probe_end = ProbeEnd(probe_sock)
    asks: list[int] = []
    mirror = MirrorCache(page_size=1)
    from radixtop.adapters.sglang.mirror import MirrorLoop
    from radixtop.gpu_backend.owner.handover import MirrorEnd

    loop = MirrorLoop(mirror, MirrorEnd(mirror_sock), on_diverged=lambda: asks.append(1))
    loop.start()

    def send(records) -> None:
        probe_end.send(RECORDS, msgspec.msgpack.encode(records))

    def settled() -> None:
        import time

        deadline = time.monotonic() + 5
        while mirror.applied < sent[0]:
            assert time.monotonic() < deadline
            time.sleep(0.01)

    sent = [0]
    try:
        first = [(RESET, 1, True), (ADD, 2, 1, b"\x05" + b"\x00" * 7, None, 1.0, 1.0, 0, 0)]
        send(first)  # a snapshot on its way (its WHOLE not yet)
        send([(ADD, 3, 99, b"\x06" + b"\x00" * 7, None, 1.0, 1.0, 0, 0)])  # a node it lacks: unlike SGLang's
        sent[0] = 3
        settled()
        assert loop.incomplete is not None and asks == [1]
        send([(WHOLE, 2)])  # the snapshot begun before the ask ends: not the one asked for
        send([(RESET, 1, False)])  # a flush's reset: not it either
        sent[0] = 5
        settled()
        assert loop.incomplete is not None
        send([(RESET, 1, True), (ADD, 2, 1, b"\x05" + b"\x00" * 7, None, 1.0, 1.0, 0, 0), (WHOLE, 2)])
        sent[0] = 8
        settled()
        assert loop.incomplete is None and asks == [1]
    finally:
        loop.close()
        probe_end.close()


def test_each_frame_of_a_whole_tree_taken_wakes_the_scheduler(sgl):
    """A scheduler that sleeps on idle (``--sleep-on-idle``: a poller on the hand-over's socket,
    one wake a second at most) would walk a big tree one slice a second: radixtop's side answers
    each frame of the whole tree it takes with a ``MORE``, which wakes it; none once it is whole."""
    import select
    import time

    from radixtop.adapters.owned.records import ADD, BEGIN, NODE, RESET, WHOLE
    from radixtop.adapters.sglang.mirror import MirrorLoop
    from radixtop.adapters.sglang.probe import MORE, RECORDS
    from radixtop.gpu_backend.owner.handover import MirrorEnd, ProbeEnd, pair

    probe_sock, mirror_sock = pair()
    probe_end = ProbeEnd(probe_sock)
    mirror = MirrorCache(page_size=1)
    loop = MirrorLoop(mirror, MirrorEnd(mirror_sock))
    loop.start()
    woken = select.poll()
    woken.register(probe_sock.fileno(), select.POLLIN)
    try:
        probe_end.send(RECORDS, msgspec.msgpack.encode([(BEGIN,), (NODE, 2, 1, b"\x05" + b"\x00" * 7, None, 1.0,
                                                                      1.0, 0, 0, ["s"])]))
        assert woken.poll(5000), "no wake while the whole tree is on its way"
        assert [f.kind for f in probe_end.commands()] == [MORE]
        probe_end.send(RECORDS, msgspec.msgpack.encode([(RESET, 1, True), (WHOLE, 1)]))
        deadline = time.monotonic() + 5
        while mirror.wholes == 0:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert mirror.by_id[2].session_ids == {"s"}
        probe_end.send(RECORDS, msgspec.msgpack.encode([(ADD, 3, 2, b"\x06" + b"\x00" * 7, None, 1.0, 1.0, 0, 0)]))
        while 3 not in mirror.by_id:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert not [f for f in probe_end.commands() if f.kind == MORE] and loop.incomplete is None
    finally:
        loop.close()
        probe_end.close()


def test_the_walks_set_of_ids_is_a_set():
    """``records.IdSet`` (the walk's ids sent, a bytearray by id): as a Python set would be, ids
    past its size (it grows), negative and huge ones (kept aside) included."""
    import random

    from radixtop.adapters.owned.records import IdSet

    rng = random.Random(4)
    mine, want = IdSet(16), set()
    for _ in range(20_000):
        node_id = rng.choice([rng.randrange(0, 5000), rng.randrange(-5, 0), rng.randrange(1 << 40, (1 << 40) + 9)])
        if rng.random() < 0.7:
            mine.add(node_id)
            want.add(node_id)
        else:
            mine.discard(node_id)
            want.discard(node_id)
        assert mine.count == len(want)
    assert all((i in mine) == (i in want) for i in [*range(-6, 5100), *range(1 << 40, (1 << 40) + 10)])


def test_the_whole_trees_end_goes_over_several_steps_and_comes_whole(sgl, monkeypatch):
    """The walk's end is the sessions' lists (50,000 open sessions at 1M nodes: one step of 20 ms
    when encoded at once): encoded a frame at least, then as long as the step's time allows, the
    rest the next steps; the copy ends with every one."""
    from radixtop.adapters.sglang import probe as probe_module
    from radixtop.adapters.sglang.probe import RecordsProbe
    from radixtop.gpu_backend.owner.handover import MirrorEnd, ProbeEnd, pair

    class Controller:  # (SGLang's SessionController as the recorder reads it)
        def __init__(self) -> None:
            self.sessions = {f"open-{i}": None for i in range(20_000)}

        def open(self, req) -> None:
            self.sessions[req.session_id] = None

        def _close(self, sid) -> None:
            self.sessions.pop(sid, None)

    from radixtop.adapters.owned import records as records_module

    monkeypatch.setattr(probe_module, "SNAPSHOT_STEP_S", 1e-6)
    monkeypatch.setattr(records_module, "PIECE", 64)
    replayer = SGLangReplayer(sgl, 20_000, eviction_policy="lru", max_running=8, max_context_len=512)
    cache = replayer.cache
    cache.enable_session_radix_cache = True
    for n in range(50):
        replayer.apply(n, {"op": "request", "input": [n + 2, n + 3], "output": [7], "session": "a"})
    probe_sock, mirror_sock = pair(64 << 10)  # (frames of ~32 KiB: the end is many)
    probe = RecordsProbe(ChangeRecorder(cache, Controller()), ProbeEnd(probe_sock))
    end = MirrorEnd(mirror_sock)
    mirror = MirrorCache(page_size=1)
    probe.start()
    left = []  # (each step's records walked and left to encode at the next)
    while probe.busy:
        probe.step()
        left.append(len(probe._unframed))
        while (frame := end.receive(0)) is not None:
            mirror.apply(msgspec.msgpack.decode(frame.payload))
    assert sum(1 for n in left if n) > 3 and not mirror.receiving
    assert set(mirror.controller.sessions) == {f"open-{i}" for i in range(20_000)}
    check_same(cache, mirror)
