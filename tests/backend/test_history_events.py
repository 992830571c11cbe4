"""The flight recorder on a KV-event stream (issue 29): the blocks that leave the tree a vLLM
stream builds are kept under their hashes, and ``why`` is checked as on the bundled engine
(``test_history.py``): after every batch the tree's own match says how many tokens of each prompt
were cached; a token past what is cached at the end was lost at the batch after the last one that
left it cached, evicted (vLLM's ``BlockRemoved``; its parent's, where vLLM evicted a parent
first and its children can no longer be reached) or flushed (``AllBlocksCleared``). SGLang's
stream, whose removals may be evictions or closes, keeps none and says so."""

from __future__ import annotations

import random

import msgspec
import pytest

from radixtop.adapters.events.adapter import EventTreeAdapter
from radixtop.adapters.events.wire import Batch, Cleared, Removed, Stored, decode_batch
from radixtop.gpu_backend.history import EVICTED, FLUSHED
from tests.backend.test_history import answered, expected

BLOCK = 4


class VLLMLike(EventTreeAdapter):
    removals_are = EVICTED


KEYS = {"int": lambda h: h, "signed": lambda h: h - (1 << 64) if h >> 63 else h,  # (SGLang's Rust core)
        "bytes": lambda h: h.to_bytes(32, "big")}  # (vLLM's digests)
"""A block's hash as engines send it."""


def stream(seed: int, keys: str = "int"):
    """Prompts over a few shared prefixes, stored block by block as vLLM stores them (only the
    blocks not cached yet, under the last cached one), removals of any stored block (a parent
    too), and now and then a reset; each op one batch of one event."""
    rng = random.Random(seed)
    heads = [[rng.randrange(1, 30) for _ in range(BLOCK * rng.randint(1, 3))] for _ in range(4)]
    prompts = []
    for _ in range(24):
        tail = [rng.randrange(1, 30) for _ in range(BLOCK * rng.randint(1, 4) + rng.randrange(BLOCK))]
        prompts.append(rng.choice(heads) + tail)
    hashes: dict[tuple, int] = {}

    def chain(prompt):
        out, parent = [], None
        for i in range(len(prompt) // BLOCK):
            block = tuple(prompt[i * BLOCK:(i + 1) * BLOCK])
            h = hashes.setdefault((parent, block), KEYS[keys](rng.getrandbits(64)))
            out.append((h, block))
            parent = h
        return out

    ops = []
    for _ in range(260):
        roll = rng.random()
        if roll < 0.55:
            ops.append(("store", rng.choice(prompts), chain))
        elif roll < 0.97:
            ops.append(("remove", rng.random(), None))
        else:
            ops.append(("clear", None, None))
    return prompts, ops


@pytest.mark.parametrize("seed", range(10))
def test_why_on_a_vllm_stream_names_the_batch_and_cause_that_removed_each_lost_token(seed):
    prompts, ops = stream(seed)
    adapter = VLLMLike(name="vllm-like", bytes_per_token=1, capacity_tokens=4096)
    adapter._tree.history.since = 0
    tree = adapter._tree
    queries = sorted({tuple(p) for p in prompts})
    cached: list[list[int]] = [[0] * len(queries)]
    causes: list = [None]
    for k, (op, arg, chain) in enumerate(ops, start=1):
        event = event_of(tree, op, arg, chain)
        adapter.apply_batch(k, Batch(float(k), None, [event] if event is not None else []))
        causes.append((FLUSHED, None) if op == "clear" else (EVICTED, None))
        cached.append([adapter.match(list(q)).matched_tokens for q in queries])
    lost_any = 0
    for i, q in enumerate(queries):
        w = adapter.why(list(q))
        assert w.cached_tokens == cached[-1][i]
        assert answered(w) == expected(i, q, cached, causes), (i, q)
        lost_any += len(w.lost)
    assert lost_any and {c[0] for c in causes[1:]} >= {EVICTED}


def test_sglangs_stream_keeps_its_history_and_says_a_removals_cause_is_not_told():
    """SGLang's KV events do not say why a block left (an eviction for room, or on 0.5.16 a
    session's close): the history keeps each removal with its cause ``unknown``, and ``why``,
    ``then``, the tree then and the journal tell when it left and that the stream does not say
    why; a clear is a flush."""
    from radixtop.adapters.text import why_lines

    adapter = EventTreeAdapter(name="sglang", bytes_per_token=1)
    adapter._tree.history.since = adapter._tree.history.stores_since = 0  # (the batches' moments are the test's)
    adapter.apply_batch(0, Batch(1.0, None, [Stored((1, 2), None, (5, 6, 7, 8), 2)]))
    adapter.apply_batch(1, Batch(2.0, None, [Removed((2,))]))
    w = adapter.why([5, 6, 7, 8])
    assert w.cached_tokens == 2 and [(x.start, x.end, x.cause, x.at) for x in w.lost] == [(2, 4, "unknown", 2.0)]
    text = "\n".join(why_lines(w, 3.0))
    assert "does not say why" in text and "evicted" not in text
    assert adapter.then(1.5).left_by_cause == {"unknown": 2}
    [left] = [c for c in adapter.then_children(1.5, 1).children]
    assert (left.left_cause, left.left_at) == ("unknown", 2.0)
    assert [g.cause for g in adapter.history().removed] == ["unknown"]
    adapter.apply_batch(2, Batch(3.0, None, [Cleared()]))
    assert adapter.why([5, 6]).lost[0].cause == FLUSHED


def test_a_tree_kept_inside_the_engines_process_keeps_no_history_and_says_why_in_one_line():
    """radixtop in SGLang's own process over the Rust core's events (``RADIXTOP_BESIDE=0``): its
    memory and time would be SGLang's, so no history there; every read of it says so."""
    from radixtop.adapters.errors import Unsupported

    why_not = "radixtop in SGLang's process keeps no history: run it beside the scheduler"
    adapter = EventTreeAdapter(name="sglang", bytes_per_token=1, no_history=why_not)
    adapter.apply_batch(0, Batch(1.0, None, [Stored((1,), None, (5, 6), 2)]))
    assert adapter._tree.history is None
    for read in (lambda: adapter.why([5, 6, 7]), lambda: adapter.then(), lambda: adapter.then_children(None, 0),
                 lambda: adapter.history()):
        with pytest.raises(Unsupported) as refused:
            read()
        assert str(refused.value) == why_not


def test_why_on_a_stream_never_names_a_removal_of_another_namespace():
    """A LoRA's or a salted request's blocks (``lora_name``, ``cache_salt``: other hashes, never
    shared): a prompt of the default namespace with the same tokens does not match them while
    they are cached, and once they left it is a miss with nothing lost; the default's own blocks
    are matched, and named once they left (the last one's removal)."""
    adapter = VLLMLike(name="vllm-like", bytes_per_token=1)
    prompt = [1, 2, 3, 4, 5, 6, 7, 8]
    for k, (h, lora, salt) in enumerate([(11, "lora-a", None), (12, None, "s1"), (13, None, None)]):
        adapter.apply_batch(2 * k, Batch(2.0 * k + 1, None, [Stored((h, h + 100), None, tuple(prompt), BLOCK,
                                                                    cache_salt=salt, lora_name=lora)]))
        assert adapter.why(prompt).cached_tokens == (8 if h == 13 else 0), "another namespace's blocks matched"
        adapter.apply_batch(2 * k + 1, Batch(2.0 * k + 2, None, [Removed((h + 100, h))]))
        answer = adapter.why(prompt)
        assert answer.cached_tokens == 0
        if h != 13:
            assert answer.lost == (), f"a removal of {lora or salt}'s named for the default namespace's prompt"
    assert [(x.start, x.end, x.node_id, x.at) for x in answer.lost] == [(0, 4, 13, 6.0), (4, 8, 113, 6.0)]
    assert adapter._tree.namespaces == {}  # (what left is no longer kept)
    # (vLLM tells a salt in the first block's extra_keys, on its wire)
    salted = {"type": "BlockStored", "block_hashes": [41], "parent_block_hash": None, "token_ids": [5, 5, 5, 5],
              "block_size": BLOCK, "lora_id": None, "medium": "GPU", "lora_name": None, "extra_keys": [["s3"]]}
    batch = decode_batch(msgspec.msgpack.encode({"ts": 19.0, "events": [salted]}))
    assert batch.events[0].first_extra_keys == ("s3",)
    adapter.apply_batch(9, batch)
    assert adapter.why([5, 5, 5, 5]).cached_tokens == 0 and adapter.stats().total_tokens == 4
    # (an engine that hashes a salted prompt as the default's, then stores the default's: the
    # block is the default's too, and matched)
    adapter.apply_batch(10, Batch(20.0, None, [Stored((31,), None, (9, 9, 9, 9), BLOCK, cache_salt="s2")]))
    assert adapter.why([9, 9, 9, 9]).cached_tokens == 0
    adapter.apply_batch(11, Batch(21.0, None, [Stored((31,), None, (9, 9, 9, 9), BLOCK)]))
    assert adapter.why([9, 9, 9, 9]).cached_tokens == 4 and 31 not in adapter._tree.namespaces
    # (a tree that keeps no history, in the engine's own process: a namespaced block that left is
    # not kept either)
    bare = VLLMLike(name="bare", bytes_per_token=1, no_history="in the engine's process")
    for k in range(50):
        bare.apply_batch(2 * k, Batch(1.0, None, [Stored((500 + k,), None, (k, k, k, k), BLOCK, cache_salt=f"u{k}")]))
        bare.apply_batch(2 * k + 1, Batch(1.0, None, [Removed((500 + k,))]))
    assert bare._tree.blocks.get(500) is None and bare._tree.namespaces == {}


def test_a_sessions_story_on_a_vllm_stream_names_the_blocks_its_requests_stored():
    from radixtop.adapters.text import session_why_lines

    adapter = VLLMLike(name="vllm-like", bytes_per_token=1)
    adapter.apply_batch(0, Batch(1.0, None, [Stored((11, 12), None, (1, 2, 3, 4, 5, 6, 7, 8), BLOCK, session_id="s")]))
    adapter.apply_batch(1, Batch(2.0, None, [Stored((13,), 12, (9, 9, 9, 9), BLOCK, session_id="t")]))
    adapter.apply_batch(2, Batch(3.0, None, [Removed((12,))]))  # (13, below it, out of reach with it)
    s, t = adapter.why_session("s"), adapter.why_session("t")
    assert [(x.at, x.cause, x.nodes, x.tokens, x.node_id) for x in s.lost] == [(3.0, "evicted", 1, 4, 12)]
    assert [(x.nodes, x.tokens, x.node_id) for x in t.lost] == [(1, 4, 13)]
    assert s.requests is None and s.lost_unit == "block"
    assert "4 tokens (block 0xc), evicted for room" in "\n".join(session_why_lines(s, 3.0))


def block_walk(tree) -> dict[int, tuple[tuple[int, ...], int, frozenset[str]]]:
    """Every block in a stream's tree now, by the history's id (``block_id``): its path's tokens
    from the root, its own tokens' count (``test_history.tree_nodes``, a block a node)."""
    from radixtop.adapters.events.block_tree import block_id

    out, stack = {}, [(tree.root, ())]
    while stack:
        node, path = stack.pop()
        for block in node.blocks:
            path = path + tuple(block.tokens)
            out[block_id(block.key)] = (path, len(block.tokens), frozenset())
        stack.extend((child, path) for child in node.children.values())
    return out


def event_of(tree, op: str, arg, chain, session: str | None = None):
    """A ``stream`` op as the engine sends it on the tree as it is: a store of the blocks of its
    prompt not cached yet (None: all are), a removal of one block (None: none to remove), a clear."""
    if op == "store":
        blocks = chain(arg)
        have = 0
        while have < len(blocks) and blocks[have][0] in tree.blocks:
            have += 1
        if have == len(blocks):
            return None
        new = blocks[have:]
        return Stored(tuple(h for h, _ in new), blocks[have - 1][0] if have else None,
                      tuple(t for _, b in new for t in b), BLOCK, session_id=session)
    if op == "remove":
        keys = sorted(tree.blocks.keys())
        return Removed((keys[int(arg * len(keys))],)) if keys else None
    return Cleared()


@pytest.mark.parametrize("seed,keys", [(seed, "int") for seed in range(6)] + [(6, "signed"), (7, "bytes")])
def test_the_tree_then_on_a_vllm_stream_is_the_tree_now_less_what_was_stored_since_plus_what_left(seed, keys):
    """``then`` at every past batch against the tree's own walk after it (``check_then``): blocks
    stored, evicted (a parent first: its children out of reach with it, and back in reach when
    it is stored again) and cleared."""
    from tests.backend.test_history_then import check_walks

    prompts, ops = stream(seed, keys)
    adapter = VLLMLike(name="vllm-like", bytes_per_token=1, capacity_tokens=4096)
    tree = adapter._tree
    tree.history.since = tree.history.stores_since = 0
    walks = [block_walk(tree)]
    for k, (op, arg, chain) in enumerate(ops, start=1):
        event = event_of(tree, op, arg, chain)
        adapter.apply_batch(k, Batch(float(k), None, [event] if event is not None else []))
        walks.append(block_walk(tree))
    check_walks(tree.history, walks, lambda: tree.root.subtree_tokens, adapter.then, every=11,
                units=lambda nodes: {path for path, _, _ in nodes.values()},  # (blocks whole: two may share tokens)
                lives=True, browse=adapter, browse_tokens=lambda i: list(tree.block_of(i).tokens))


def test_a_stream_whose_batches_come_from_engines_with_clocks_apart_keeps_each_moment_one_tree():
    """Batches stamped by two engines whose clocks are 5 s apart, interleaved (a stream's ranks):
    a batch stamped before one told already is told at that one's moment, so the journals stay in
    order and the tree at a moment is the tree after every batch told by then (``check_then``),
    where a search over stamps out of order gave another."""
    from tests.backend.test_history_then import check_then

    prompts, ops = stream(2)
    adapter = VLLMLike(name="vllm-like", bytes_per_token=1, capacity_tokens=4096)
    tree = adapter._tree
    tree.history.since = tree.history.stores_since = 0
    walks, stamps = [block_walk(tree)], [0.0]
    for k, (op, arg, chain) in enumerate(ops, start=1):
        event = event_of(tree, op, arg, chain)
        ts = float(k if k % 2 else k - 5) + 10.0  # (the odd batches' engine 5 s ahead)
        changes = tree.history.stored_count
        adapter.apply_batch(k, Batch(ts, None, [event] if event is not None else []))
        walks.append(block_walk(tree))
        told = tree.history.stored_count > changes  # (a batch that changed nothing tells nothing)
        stamps.append(max(stamps[-1], ts) if told else stamps[-1])
    tree_now = tree.root.subtree_tokens
    for t in range(10, int(stamps[-1]) + 1, 7):
        last = max(j for j in range(len(stamps)) if stamps[j] <= t)
        check_then(tree.history, float(t), walks[last], walks[-1], lambda: tree_now, adapter.then,
                   units=lambda nodes: {path for path, _, _ in nodes.values()}, lives=True)
    assert len({len(w) for w in walks}) > 5, "the tree never moved: the test proves nothing"


def test_a_blocks_id_is_its_hash_as_64_bits_unsigned_whatever_sign_the_engine_gives_it():
    """SGLang's Rust core hashes a block to a signed 64-bit int, vLLM to a digest: the history's id
    is the same 64 bits, unsigned (what crosses the wire and shows as 0x...)."""
    from radixtop.adapters.events.block_tree import block_id

    assert block_id(-1) == (1 << 64) - 1 and block_id(5) == 5
    assert block_id(b"\xff" * 8) == (1 << 64) - 1 and 0 <= block_id((3, -7)) < 1 << 64


def test_a_lost_frame_ends_the_cause_an_action_told_and_a_gap_is_when_it_is_found():
    """A cause told for an action's removals (``caused``) ends where frames were lost (its closing
    frame may be among them): the stream's own removals after are evictions again. A gap (frames
    lost, the tree restarted) is at the moment it is found, not the last batch's: a moment before
    it is out of reach."""
    adapter = VLLMLike(name="vllm-like", bytes_per_token=1, capacity_tokens=4096)
    tree = adapter._tree
    adapter.apply_batch(1, Batch(100.0, None, [Stored((1, 2), None, (1, 2, 3, 4, 5, 6, 7, 8), BLOCK)]))
    adapter.caused("evict_action", "radixtop's evict")
    adapter.apply_batch(2, Batch(101.0, None, [Removed((2,))]))
    adapter.missed(1)  # (the closing frame lost with others)
    adapter.apply_batch(4, Batch(102.0, None, [Removed((1,))]))
    assert [g.cause for g in tree.history.ghosts()] == ["evict_action", "evicted"]
    adapter.caused("magic", "?")  # (a cause it does not know: the stream's own, and no thread down)
    adapter.apply_batch(5, Batch(103.0, None, [Stored((3,), None, (9, 9, 9, 9), BLOCK), Removed((3,))]))
    assert tree.history.ghosts()[-1].cause == "evicted"
    import time as _time

    assert tree.history.then_reaches_back_to() > 102.0 and tree.history.then_reaches_back_to() <= _time.time()


@pytest.mark.parametrize("seed", range(6))
def test_the_sessions_memory_then_on_a_stream_with_sessions_is_what_the_tree_attributed_then(seed):
    """A stream whose stores name their session (SGLang 0.5.19+'s ``session_id``, vLLM's): the
    sessions' memory at every past batch (``then``'s ``memory``) against the block tree's
    from-scratch attribution after it: nodes held, exclusive and path tokens; a batch of several
    events (stores, removals of a parent, a clear) is one moment. A stream that names no session
    says its sessions' memory is not known."""
    prompts, ops = stream(seed)
    adapter = VLLMLike(name="vllm-like", bytes_per_token=2, capacity_tokens=4096)
    tree = adapter._tree
    tree.history.since = tree.history.stores_since = tree.history.marks_since = 0
    rng = random.Random(seed)
    assert adapter.then(None).memory is None and adapter.then(None).memory_since is None  # (no session named yet)

    def attributed() -> dict[str, tuple[int, int, int]]:
        return {sid: (f.tagged_nodes, f.exclusive, f.path - f.exclusive)
                for sid, f in tree.attribute().sessions.items() if f.tagged_nodes or f.path}

    then = [attributed()]
    batch: list = []
    k = 0
    for op, arg, chain in ops:
        event = event_of(tree, op, arg, chain, f"s{rng.randrange(5)}")
        if event is not None:
            batch.append(event)
        if rng.random() < 0.6:  # (else the next op's event joins this batch)
            k += 1
            adapter.apply_batch(k, Batch(float(k), None, batch))
            batch = []
            then.append(attributed())
    assert tree.history.marks_since == 0
    for moment in range(1, len(then)):
        v = adapter.then(float(moment))
        got = {x.session_id: (x.tagged_nodes, x.exclusive_tokens, x.shared_tokens) for x in v.memory}
        assert v.bytes_per_token == 2 and v.memory_sessions == len(then[moment]), moment
        assert got == {sid: then[moment][sid] for sid in got}, moment
    assert len({tuple(sorted(m.items())) for m in then}) > 20 and any(e for m in then for _, e, _ in m.values())


def test_a_live_diff_counts_what_left_between_its_two_moments_as_its_trees_tell_them():
    """``radixtop diff 10m 1m`` of a stream: each moment's tree is as of the end of its millisecond,
    so what left later in the first one's millisecond is already gone from the first tree, not
    "left between"; what came later in the second one's is in the second tree, and what left
    after it is not "left between"."""
    from radixtop.cli.recording import diff_live

    adapter = VLLMLike(name="vllm-like", bytes_per_token=1)
    adapter._tree.history.since = adapter._tree.history.stores_since = 0
    adapter.apply_batch(0, Batch(100.0001, None, [Stored((5,), None, (1, 2, 3, 4), BLOCK)]))
    adapter.apply_batch(1, Batch(100.0004, None, [Removed((5,))]))  # (0.2 ms after the first moment)
    adapter.apply_batch(2, Batch(101.0, None, [Stored((6,), None, (3, 4, 5, 6), BLOCK)]))
    adapter.apply_batch(3, Batch(101.5004, None, [Stored((7,), None, (7, 7, 7, 7), BLOCK)]))  # (0.2 ms after
    adapter.apply_batch(4, Batch(101.5021, None, [Removed((6,))]))  # the second moment; then past its ms)
    d = diff_live(adapter, 100.0002, 101.5002)
    assert d["figures"]["cached_tokens"] == {"from": 0, "to": 8, "change": 8}
    assert (d["left"]["nodes"], d["left"]["tokens"]) == (0, 0)
