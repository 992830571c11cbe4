"""The plugin's use of the Rust core's KV events never harms the scheduler: events recorded where
radixtop does not attach are taken and dropped (they would pile up in the core forever), and a
batch the tree cannot apply never stops the applying thread."""

from __future__ import annotations

import types

from radixtop.adapters.events.adapter import EventTreeAdapter
from radixtop.adapters.events.wire import Stored
from radixtop.adapters.sglang import plugin
from radixtop.adapters.sglang.events.core import CoreEvents


class RecordingCache:
    """What the plugin reads of a Rust-core cache that records KV events."""

    def __init__(self) -> None:
        self.tree_core = types.SimpleNamespace(kv_events=types.SimpleNamespace(enabled=True))
        self.taken = 0

    def take_events(self) -> list:
        self.taken += 1
        return []


def test_events_are_taken_where_the_plugin_does_not_attach():
    """Another TP rank (the plugin serves from the first only): its core records all the same."""
    scheduler = types.SimpleNamespace(tp_rank=1, tree_cache=RecordingCache(), kv_events_publisher=None)
    plugin._after_init(None, scheduler)
    for _ in range(10):
        plugin._after_inputs(None, scheduler)
    assert scheduler.tree_cache.taken == 10


def test_events_sglangs_own_publisher_takes_are_left_to_it():
    publisher = types.SimpleNamespace(enable_kv_cache_events=True)
    scheduler = types.SimpleNamespace(tp_rank=1, tree_cache=RecordingCache(), kv_events_publisher=publisher)
    for _ in range(3):
        plugin._after_inputs(None, scheduler)
    assert scheduler.tree_cache.taken == 0


def test_the_unread_decision_is_the_schedulers_own_not_a_reused_ids():
    """Whether a cache's events are read by nobody was kept by id(scheduler): a scheduler gone
    (an earlier test's) left its answer to a new one that got the same id, and the new one's
    events, which SGLang's own publisher takes, were taken (CI failed on it once, in an order
    where ids were reused)."""
    publisher = types.SimpleNamespace(enable_kv_cache_events=True)
    scheduler = types.SimpleNamespace(tp_rank=1, tree_cache=RecordingCache(), kv_events_publisher=publisher)
    getattr(plugin, "_UNREAD", {})[id(scheduler)] = True  # what a gone scheduler with this id left
    unread = types.SimpleNamespace(tp_rank=2, tree_cache=RecordingCache(), kv_events_publisher=None)
    for _ in range(3):
        plugin._after_inputs(None, unread)  # nobody reads this one's events: they are taken
        plugin._after_inputs(None, scheduler)
    assert scheduler.tree_cache.taken == 0 and unread.tree_cache.taken == 3


class Breaks(EventTreeAdapter):
    def apply_batch(self, seq, batch):
        if seq == 0:
            raise RuntimeError("a bug in the tree")
        super().apply_batch(seq, batch)


def test_a_batch_the_tree_cannot_apply_never_stops_the_thread():
    tree = Breaks(name="t", bytes_per_token=1)
    core = CoreEvents(RecordingCache(), tree)
    try:
        core._put(1.0, [object()])  # batch 0: the tree fails on it
        core._put(2.0, [Stored((7,), None, (1, 2), 2)])  # batch 1: must still be applied
        assert tree.wait_for_seq(1, 5.0)
        assert core._thread.is_alive()
        status = tree.status()
        assert status.bad_batches == 1 and not status.complete and "a bug in the tree" in status.last_error
    finally:
        core.close()


def test_the_capabilities_say_each_thing_once():
    """The plugin's reason on the Rust core: its own notes, then the tree's health, each once (the
    sessions note came twice when the tree's reason was split apart to reuse it)."""
    from radixtop.adapters.events.wire import Batch
    from radixtop.adapters.model import Capabilities
    from radixtop.adapters.sglang.events.core import CoreEventsAdapter

    tree = EventTreeAdapter(name="t", bytes_per_token=1)
    tree.apply_batch(0, Batch(1.0, None, [Stored((7,), None, (1, 2), 2, session_id="s1")]))
    tree.skipped(1, "batch 1: broken")
    sglang = types.SimpleNamespace(
        name="sglang", read_only=False, tree=types.SimpleNamespace(kind="UnifiedRadixCache (rust core)"),
        capabilities=lambda: Capabilities(tree=False, sessions=False, close=False, evict=True, flush=True,
                                          changes=False, read_only=False, reason="rust"))
    core = CoreEvents(RecordingCache(), tree)
    try:
        caps = CoreEventsAdapter(sglang, core).capabilities()
    finally:
        core.close()
    assert caps.tree and caps.sessions and caps.evict
    assert caps.reason.count("sessions are those whose requests stored each block") == 1, caps.reason
    assert caps.reason.count("the tree may be incomplete") == 1 and "no event batch" not in caps.reason


def test_requests_given_back_cross_in_frames_that_fit_and_a_served_frame_never_harms_the_tree():
    """The probe's ``SERVED`` frames: rows over a frame go in halves (a socket's frames may be as
    small as 1 KB), a request alone over one goes without its token ids, and one over it even so
    (an id of a kilobyte here) is not told; nothing raises into the scheduler's step. Beside, a
    frame that is not one is dropped, and each request of one that is is told to the history: its
    begin with its prompt's ids and its hit (at its admission where a ``begin`` row told it, else
    with its end), its finish with its output's (or its abort)."""
    from array import array

    import msgspec

    from radixtop.adapters.sglang.events.core import CoreTree
    from radixtop.adapters.sglang.probe import SERVED, EventsProbe

    sent: list = []

    class End:
        frame_max = 300
        held = 0

        def send(self, kind: int, payload: bytes) -> bool:
            assert len(payload) <= self.frame_max
            sent.append((kind, msgspec.msgpack.decode(payload)))
            return True

    def ids(*tokens: int) -> bytes:
        return array("q", tokens).tobytes()

    probe = EventsProbe.__new__(EventsProbe)
    probe.end, probe._encode = End(), msgspec.msgpack.Encoder().encode
    rows = [("s", f"r{i}", 2, i % 2, "finish", ids(1, 2), ids(3), 100.0 + i, False) for i in range(12)]
    rows += [("s", "long", 40, 0, "finish", ids(*range(40)), ids(9), 120.0, False),
             ("x" * 1000, "big", 1, 0, "abort", ids(1), None, 121.0, False),
             (None, "last", 3, 1, "abort", ids(4, 5, 6), None, 122.0, False)]
    probe._send_served(rows)
    told = [tuple(row) for kind, batch in sent for row in batch]
    assert {kind for kind, _ in sent} == {SERVED} and len(sent) > 2
    assert told == [*rows[:12], ("s", "long", 40, 0, "finish", None, None, 120.0, False), rows[-1]]
    sent.clear()
    probe.end.held = 1  # the socket behind (frames wait): the rows go without their ids
    probe._send_served(rows[:2])
    assert [tuple(row) for _, batch in sent for row in batch] == [(*row[:5], None, None, *row[7:]) for row in rows[:2]]

    tree = CoreTree(name="beside")
    tree.tells_requests()
    tree.served(b"not msgpack")
    tree.served(msgspec.msgpack.encode([["s", 1]]))
    tree.served(msgspec.msgpack.encode([["s", "r", 2, 1, "finish", b"odd", None, 1.0, False]]))
    tree.served(msgspec.msgpack.encode([["s", "r", 2**64 - 1, 1, "finish", None, None, 1.0, False]]))
    tree.served(msgspec.msgpack.encode([["s", "r", 2, 1, "finish", None, None, float("inf"), False]]))
    tree.served(msgspec.msgpack.encode([["s", "r", 2, 1, "finish", None, None, 1.0]]))  # (a row of 8: not one)
    tree.served(msgspec.msgpack.encode([rows[0], rows[-1]]))
    tree.served(msgspec.msgpack.encode([("t", "a", 3, 2, "begin", ids(7, 8, 9), None, 130.0, False),
                                        ("t", "b", 4, 0, "begin", ids(1, 2, 3, 4), None, 130.5, False)]))
    tree.served(msgspec.msgpack.encode([("t", "b", 4, 0, "finish", ids(1, 2, 3, 4), ids(6), 131.0, True),
                                        ("t", "a", 3, 2, "abort", ids(7, 8, 9), None, 131.5, True)]))
    ops = [(e.op, e.session_id, e.request_id, e.prompt_tokens, e.cached_tokens, e.tokens, e.at)
           for e in tree.history(0, 0).served]
    assert ops == [("begin", "s", "r0", 2, 0, (1, 2), 100.0), ("finish", "s", "r0", 0, 0, (3,), 100.0),
                   ("begin", None, "last", 3, 1, (4, 5, 6), 122.0), ("abort", None, "last", 0, 0, None, 122.0),
                   ("begin", "t", "a", 3, 2, (7, 8, 9), 130.0), ("begin", "t", "b", 4, 0, (1, 2, 3, 4), 130.5),
                   ("finish", "t", "b", 0, 0, (6,), 131.0), ("abort", "t", "a", 0, 0, None, 131.5)]


def test_a_request_that_cannot_be_told_never_stops_the_trees_records():
    """The Python cores' probe tells each request SGLang gives back, and each close, as ``OP``
    records; a request of another shape (its ``finished`` raises) is left out, once logged, and
    the recorder goes on (a hook's failure would stop the tree's copy: ``_failed``)."""
    from array import array

    from radixtop.adapters.owned.records import OP, _Recorder
    from radixtop.adapters.sglang.records import hook_requests

    class Cache:
        def cache_finished_req(self, req, *a, **k):
            return None

        def release_radix_session(self, sid):
            return 0

    class Odd:
        rid = "odd"

        def finished(self):
            raise RuntimeError("a request of another shape")

    class Done:
        rid, session_id, cached_tokens, finished_reason = "r1", "s", 2, None
        origin_input_ids, output_ids = array("q", [1, 2, 3]), array("q", [4])

        def finished(self):
            return True

    recorder, cache = _Recorder(), Cache()
    hook_requests(recorder, cache, cache)
    cache.cache_finished_req(Odd())
    cache.cache_finished_req(Done())
    cache.release_radix_session("s")
    assert recorder.failed is None
    assert recorder.records == [(OP, "begin", "s", "r1", array("q", [1, 2, 3]).tobytes(), 3, 2, 0),
                                (OP, "finish", "s", "r1", array("q", [4]).tobytes(), 0, 0, 0),
                                (OP, "close", "s", None, None, 0, 0, 0)]


def test_an_admitted_request_that_cannot_be_told_leaves_the_others_of_its_batch_told():
    """``records.admitted_begins`` over a batch where one request cannot be read (a field of
    another shape): the others are told at their admission, and only those are among the begun
    (the one that could not be told is told whole at its end, not as a finish without a begin)."""
    from array import array

    from radixtop.adapters.sglang.records import admitted_begins

    def req(rid: str, cached: object) -> types.SimpleNamespace:
        return types.SimpleNamespace(rid=rid, extend_batch_idx=1, retracted_stain=False, session_id="s",
                                     origin_input_ids=array("q", [1, 2, 3]), cached_tokens=cached)

    plan = types.SimpleNamespace(batch_to_run=types.SimpleNamespace(
        reqs=[req("a", 1), req("bad", "x"), req("c", 2)], decoding_reqs=None))
    begun: set[str] = set()
    told = admitted_begins(plan, begun)
    assert [(rid, cached) for _, rid, _, cached, _ in told] == [("a", 1), ("c", 2)]
    assert begun == {"a", "c"}


def test_the_probes_rows_are_bounded_while_nobody_takes_them_and_its_begun_start_again_with_its_process():
    """The probe's wraps stay on SGLang's methods while radixtop's process is down or the probe
    stopped stepping: the rows it keeps for the next step are bounded (``SERVED_MOST``), never
    SGLang's memory without end; and a new process beside starts with no request told as begun
    (what the old one heard of them is gone with it: their ends tell them whole)."""
    from radixtop.adapters.sglang import probe as probe_module
    from radixtop.adapters.sglang.probe import EventsProbe

    class Cache:
        def on_release(self, req):
            return None

    class Scheduler:
        def __init__(self):
            self.plan = None

        def get_new_batch_prefill(self):
            return self.plan

    cache, scheduler = ReleasingCache(), Scheduler()
    probe = EventsProbe.__new__(EventsProbe)
    probe.cache, probe.served, probe.begun, probe.again = cache, [], set(), []
    probe._hook_served(cache)
    probe.hook_admissions(scheduler)
    done = types.SimpleNamespace(finished=lambda: True, finished_reason=None, output_ids=[9], session_id=None,
                                 origin_input_ids=[1, 2], cached_tokens=0)
    for i in range(probe_module.SERVED_MOST + 50):
        done.rid = f"r{i}"
        cache.on_release(done)
    assert len(probe.served) == probe_module.SERVED_MOST
    scheduler.plan = types.SimpleNamespace(batch_to_run=types.SimpleNamespace(reqs=[types.SimpleNamespace(
        rid="late", extend_batch_idx=1, retracted_stain=False, session_id=None, origin_input_ids=[1],
        cached_tokens=0)], decoding_reqs=None))
    scheduler.get_new_batch_prefill()
    assert len(probe.served) == probe_module.SERVED_MOST and "late" not in probe.begun  # (told whole at its end)
    probe.served.clear()
    scheduler.get_new_batch_prefill()
    assert "late" in probe.begun
    probe.restarted(end := object())
    assert probe.begun == {"late"} and probe.end is end  # (its begin row is yet to go: to the new process)
    probe.served.clear()
    probe.restarted(end := object())
    assert probe.begun == set() and probe.end is end


class DroppingEnd:
    """A probe's end of the hand-over whose backlog is full while ``full``: each frame it drops
    (numbered all the same, as ``ProbeEnd.send``); those it takes decoded into ``sent``."""

    frame_max, held, down, full, seq = 1 << 16, 0, False, False, 0
    sent: list

    @classmethod
    def sending_to(cls, sent: list) -> type[DroppingEnd]:
        return type("End", (cls,), {"sent": sent})

    def send(self, kind: int, payload: bytes) -> bool:
        import msgspec

        self.seq += 1
        if self.full:
            return False
        self.sent.append((kind, msgspec.msgpack.decode(payload)))
        return True

    def close(self) -> None:
        pass

    def flush(self) -> int:
        return self.held


class ReleasingCache:
    """What the Rust core's probe wraps and takes of a cache: its ``on_release``, its events (none)."""

    def on_release(self, req):
        return None

    def take_events(self):
        return []


class TakingRecorder:
    """What a Python core's probe takes of its recorder: the records, the requests begun."""

    failed = None

    def __init__(self) -> None:
        self.records: list = []
        self.begun: set[str] = set()

    def take(self) -> list:
        records, self.records = self.records, []
        return records


def dropped_along_the_way(begin, end, step) -> None:
    """Requests r1, r2 and r3 begun and ended, a frame dropped on the way of each: r1's begin, r2's
    end, r3's begin and end in one frame."""
    begin("r1")
    step(full=True)
    end("r1")
    step(full=False)
    begin("r2")
    step(full=False)
    end("r2")
    step(full=True)
    step(full=False)
    begin("r3")
    end("r3")
    step(full=True)
    step(full=False)


def test_a_served_frame_the_socket_drops_never_splits_a_request_begin_from_its_end():
    """Under overload the hand-over drops a frame (its backlog full): a ``SERVED`` frame dropped
    must not leave the history a request's end without its begin (its begin row dropped, its end
    row saying the begin was told) nor a begin without its end (its end row dropped: a replay
    would keep it running). A begin dropped is told with the request's end; an end dropped is
    sent again at a later step; each request is told once, begin and end, whatever was dropped."""
    import msgspec

    from radixtop.adapters.sglang.probe import SERVED, EventsProbe

    sent: list = []
    End = DroppingEnd.sending_to(sent)

    class Scheduler:
        plan = None

        def get_new_batch_prefill(self):
            return self.plan

    def admit(*rids: str) -> None:
        scheduler.plan = types.SimpleNamespace(batch_to_run=types.SimpleNamespace(reqs=[types.SimpleNamespace(
            rid=rid, extend_batch_idx=1, retracted_stain=False, session_id="s", origin_input_ids=[1, 2],
            cached_tokens=1) for rid in rids], decoding_reqs=None))
        scheduler.get_new_batch_prefill()

    def release(rid: str) -> None:
        cache.on_release(types.SimpleNamespace(rid=rid, finished=lambda: True, finished_reason=None, output_ids=[9],
                                               session_id="s", origin_input_ids=[1, 2], cached_tokens=1))

    def step(full: bool) -> None:
        probe.end.full = full
        probe.step()

    cache, scheduler = ReleasingCache(), Scheduler()
    probe = EventsProbe.__new__(EventsProbe)
    probe.cache, probe.end, probe.served, probe.begun, probe.again = cache, End(), [], set(), []
    probe._encode = msgspec.msgpack.Encoder().encode
    probe._hook_served(cache)
    probe.hook_admissions(scheduler)
    admit("r0")
    dropped_along_the_way(admit, release, step)
    release("r0")  # (its begin dropped with r1's: told at its end)
    step(full=False)
    rows = [row for kind, frame in sent if kind == SERVED for row in frame]
    told = {rid: [(how, begun) for _, r, _, _, how, _, _, _, begun in rows if r == rid] for rid in ("r0", "r1", "r2", "r3")}
    for rid, hows in told.items():
        begins = sum(1 for how, begun in hows if how == "begin" or not begun)
        ends = sum(1 for how, _ in hows if how != "begin")
        assert (begins, ends) == (1, 1), (rid, hows)
    assert not probe.served and not probe.begun
    # a new process beside: what it is told of the rows still waiting is whole (its history is new)
    admit("r5")
    step(full=False)  # r5's begin told to the process that is gone
    admit("r6")
    release("r5")
    sent.clear()
    probe.restarted(End())
    release("r6")
    step(full=False)
    rows = [row for kind, frame in sent if kind == SERVED for row in frame]
    for rid in ("r5", "r6"):
        hows = [(how, begun) for _, r, _, _, how, _, _, _, begun in rows if r == rid]
        begins = sum(1 for how, begun in hows if how == "begin" or not begun)
        assert (begins, sum(1 for how, _ in hows if how != "begin")) == (1, 1), (rid, hows)


def test_a_records_frame_the_socket_drops_never_splits_a_request_begin_from_its_end():
    """The Python cores' probe (``RecordsProbe``): a frame of records dropped under overload is a
    gap the copy beside mends by taking the whole tree again, but the requests' ``OP`` records in
    it are not in any tree: dropped, they left the history a finish without its begin or a begin
    never ended. They are sent again; and a new process beside hears no request's finish whose
    begin only the old one heard (its begun ones are told whole at their ends)."""

    from radixtop.adapters.owned.records import ADD, OP
    from radixtop.adapters.sglang.probe import RECORDS, RecordsProbe

    sent: list = []
    End = DroppingEnd.sending_to(sent)

    def begin(rid: str) -> None:
        recorder.begun.add(rid)
        recorder.records.append((OP, "begin", "s", rid, b"\x01" + b"\x00" * 7, 1, 0, 0))

    def finish(rid: str) -> None:
        recorder.begun.discard(rid)
        recorder.records.append((OP, "finish", "s", rid, None, 0, 0, 0))

    def step(full: bool) -> None:
        probe.end.full = full
        recorder.records.append((ADD, 9, 1, b"", None, 1.0, 1.0, 0, 0))  # (a change of the tree: each step has one)
        probe.step(now=True)

    def told() -> dict:
        ops: dict = {}
        for kind, frame in sent:
            for record in frame:
                if kind == RECORDS and record[0] == OP:
                    ops.setdefault(record[3], []).append(record[1])
        return ops

    recorder = TakingRecorder()
    probe = RecordsProbe(recorder, End())
    dropped_along_the_way(begin, finish, step)
    assert told() == {"r1": ["begin", "finish"], "r2": ["begin", "finish"], "r3": ["begin", "finish"]}
    begin("r4")
    begin("r7")
    step(full=False)  # r4's and r7's begins heard by the process that is gone (r7 still running)
    begin("r5")
    finish("r4")
    begin("r6")
    step(full=True)  # the old process fell behind: r5's and r4's end dropped there
    sent.clear()
    probe.restarted(End())
    assert recorder.begun == {"r5", "r6"}  # (not r7: the new process never heard its begin: told whole at its end)
    step(full=False)
    finish("r5")
    step(full=False)
    assert told() == {"r5": ["begin", "finish"], "r6": ["begin"]}


def test_the_rows_and_records_sent_again_stay_bounded_and_small_while_radixtop_is_behind(monkeypatch):
    """Found by review: while radixtop's process stays behind (its backlog full), what is sent
    again was every dropped request's rows or records, with their token ids, encoded again and
    dropped again every step: the scheduler's step grew from 1 to 140 ms in 30 s and SGLang's
    process held 86 MiB. Now they wait, without their ids, at most ``AGAIN_MOST`` of them, until
    the socket keeps up; and new requests' ends are never refused for them."""
    import msgspec

    from radixtop.adapters.owned.records import OP
    from radixtop.adapters.sglang import probe as probe_module
    from radixtop.adapters.sglang.probe import EventsProbe, RecordsProbe

    monkeypatch.setattr(probe_module, "AGAIN_MOST", 100)
    sent: list = []
    End = DroppingEnd.sending_to(sent)

    cache = ReleasingCache()
    probe = EventsProbe.__new__(EventsProbe)
    probe.cache, probe.end, probe.served, probe.begun, probe.again = cache, End(), [], set(), []
    probe._encode = msgspec.msgpack.Encoder().encode
    probe._hook_served(cache)
    recorder = TakingRecorder()
    records = RecordsProbe(recorder, End())
    for end in (probe.end, records.end):
        end.full, end.held = True, 1  # (behind: frames wait in the backlog, and it is full)
    ids = list(range(2000))
    for step in range(20):
        for i in range(50):
            rid = f"r{step}-{i}"
            cache.on_release(types.SimpleNamespace(rid=rid, finished=lambda: True, finished_reason=None, output_ids=ids,
                                                   session_id="s", origin_input_ids=ids, cached_tokens=0))
            recorder.records.append((OP, "finish", "s", rid, b"\0" * 16000, 0, 0, 0))
        probe.step()
        records.step(now=True)
        assert len(probe.again) <= 100 and len(records._again) <= 100
        assert not probe.served  # (nothing kept back that would refuse a new request's end)
    assert all(row[5] is None and row[6] is None for row in probe.again)
    assert all(record[4] is None for record in records._again)
    for end in (probe.end, records.end):
        end.full, end.held = False, 0  # (it keeps up again: what waited goes)
    probe.step()
    records.step(now=True)
    assert not probe.again and not records._again and len(sent) >= 2
