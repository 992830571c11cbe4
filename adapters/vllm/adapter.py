"""VLLMAdapter: a vLLM server's prefix cache, from its KV events and its own figures.

vLLM caches full blocks (``--block-size`` tokens) chained by hash and publishes each change over
ZMQ (``--kv-events-config``): ``BlockStored`` (with the request's ``session_id`` where it had one),
``BlockRemoved`` (one per evicted block) and ``AllBlocksCleared`` (a reset, published with the
engine's next step). The tree is the engine-neutral event tree (``adapters.events``): a node is a
run of blocks with no branch; ``group_idx`` keeps a hybrid model's KV groups apart and
``extra_keys`` (a ``cache_salt``, a LoRA) are already in the hashes. vLLM caches a prompt's last full
block again when it recomputes it (same hash, another block of its pool): the tree shows it once,
and counts the copy in the pool's figures.

What the events do not say comes from the server (``--vllm-url``): the pool's size
(``vllm:cache_config_info``: ``num_gpu_blocks``, one of them vLLM's null block), the blocks running
requests hold (``vllm:kv_cache_usage_perc``), the prefix-cache queries and hits (the hit rate),
and the model (``/v1/models``' root, read for its geometry where that folder is on this machine).
vLLM publishes no eviction counter: evictions are counted from ``BlockRemoved``. vLLM tells no
locks or reference counts (vllm#50732's ``BlockInactive`` would), has no route to evict part of the
cache or to close a session: only a flush (``/reset_prefix_cache``, dev mode), previewed, confirmed
and audited as every action.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from radixtop.adapters.errors import Unsupported, read_only
from radixtop.adapters.events.zmq import KVEventsAdapter, rank_endpoint
from radixtop.adapters.http.proxy import is_loopback_host
from radixtop.adapters.model import (
    TREE_FINDING_KINDS,
    Capabilities,
    Diagnosis,
    Finding,
    FlushResultView,
    Geometry,
    Stats,
)
from radixtop.adapters.text import one_line
from radixtop.adapters.vllm.server import DEV_MODE_HINT, Figures, VLLMServer, geometry_from
from radixtop.gpu_backend.history import EVICTED

MAX_NAME = 80
"""The most of the server's model name the target's name keeps."""
NO_ACTIONS = ("vLLM tells no locks or reference counts (vllm#50732's BlockInactive would) and has no route to "
              "evict part of its cache or to close a session")


def default_replay(events: str) -> str | None:
    """The replay socket beside a ``tcp://host:port`` publisher: port + 1 (as vLLM's examples set
    it; ``rank_endpoint``'s offset, the host as given); None for another transport."""
    return rank_endpoint(events, 1, local=False) if events.startswith("tcp://") else None


class VLLMAdapter(KVEventsAdapter):
    """One DP rank of a vLLM server: its tree from ``events`` (and ``replay``: None for the
    publisher's port + 1, "" for none), its figures from ``url`` (None: the events alone, as any
    KV-event stream). ``geometry``: the model's (None: from the server's model folder where it is
    on this machine). Reads of ``url`` are bounded by ``timeout``."""

    def __init__(self, events: str, replay: str | None = None, *, url: str | None = None,
                 api_key: str | None = None, dp_rank: int = 0, geometry: Geometry | None = None,
                 capacity_tokens: int = 0, topic: str = "", tokenizer: Any = None, timeout: float = 5.0,
                 name: str | None = None):
        self.server = VLLMServer(url, api_key=api_key, timeout=timeout) if url else None
        self._geometry_note = ""
        self._can_reset: bool | None = None
        self.read_only = False
        try:
            model: dict[str, Any] = {}
            if self.server is not None:
                figures = self.server.figures(dp_rank)  # a server that is not vLLM says so now, in one line
                model = self.server.model()
                if geometry is None:
                    geometry = self._local_geometry(model, figures)
            served = model.get("id")
            served = one_line(served[:MAX_NAME]) + " " if isinstance(served, str) and served else ""
            label = name or f"vLLM {served}at {self.server.url if self.server else events}"
            super().__init__(events, default_replay(events) if replay is None else (replay or None), topic=topic,
                             dp_rank=dp_rank, geometry=geometry, capacity_tokens=capacity_tokens,
                             name=label + (f" rank {dp_rank}" if dp_rank else ""), tokenizer=tokenizer)
        except BaseException:
            if self.server is not None:
                self.server.close()
            raise

    removals_are = EVICTED
    """vLLM's prefix cache drops a cached block only when the pool hands it to another request (an
    eviction for room; a reset is ``AllBlocksCleared``, told as flushed)."""

    def _local_geometry(self, model: dict[str, Any], figures: Figures) -> Geometry | None:
        """The geometry of the server's model folder (``/v1/models``' root), where this machine
        has it (a server on loopback: another host's paths mean nothing here); None, with the
        reason kept for the capabilities, where not."""
        root = model.get("root")
        assert self.server is not None
        if not is_loopback_host(urlsplit(self.server.url).hostname or ""):
            self._geometry_note = ("bytes unknown: the server is on another host, whose model folder radixtop does "
                                   "not read; give --model (a preset or the model's folder)")
            return None
        if not isinstance(root, str) or not (Path(root) / "config.json").is_file():
            self._geometry_note = (f"bytes unknown: the server's model ({root!r}) is not a folder on this machine; "
                                   "give --model (a preset or the model's folder)")
            return None
        try:
            return geometry_from(root, figures.cache_dtype or "auto", figures.block_size or 1)
        except ValueError as exc:
            self._geometry_note = f"bytes unknown: {exc}"
            return None

    def release(self) -> None:
        try:
            super().release()
        finally:
            if self.server is not None:
                self.server.close()

    # ----- figures -----

    def _figures(self) -> Figures | None:
        return None if self.server is None else self.server.figures(self.dp_rank)

    def stats(self) -> Stats:
        """The tree's figures from the events; with the server, the pool in SGLang's leak-check
        words: capacity = the usable blocks; unevictable = what running requests hold (vLLM's usage
        gauge: in the tree or not, vLLM does not tell apart); evictable = the cached blocks (the
        tree and its copies) beyond those, so exact when idle and a lower bound under load;
        available = the rest. Prompt and cached tokens are vLLM's prefix-cache queries and hits;
        evicted tokens are the blocks ``BlockRemoved`` named."""
        base = super().stats()
        with self._lock:
            copies, removed = self._tree.copies, self._counts["removed_blocks"]
        f = self._figures()
        block = (f.block_size if f else None) or base.geometry.page_size or 1
        evicted = removed * block
        if f is None or f.usable_blocks is None:
            return dataclasses.replace(base, evicted_tokens=evicted)
        capacity = f.usable_blocks * block
        held = (f.held_blocks or 0) * block
        cached = min(base.total_tokens + copies * block, capacity)
        evictable = min(max(cached - held, 0), capacity - held)
        geometry = dataclasses.replace(base.geometry, page_size=block)
        return dataclasses.replace(
            base, capacity_tokens=capacity, available_tokens=capacity - held - evictable, evictable_tokens=evictable,
            unevictable_tokens=held if f.usage is not None else None, prompt_tokens=f.queries, cached_tokens=f.hits,
            evicted_tokens=evicted, geometry=geometry)

    def _resettable(self) -> bool:
        if self._can_reset is None and self.server is not None:
            self._can_reset = self.server.can_reset()
        return bool(self._can_reset)

    def capabilities(self) -> Capabilities:
        base = super().capabilities()
        st = self.status()
        notes = [f"vLLM's cache rebuilt from its KV events; {NO_ACTIONS}: close and evict are unavailable"]
        if self.sessions_seen():
            notes.append("sessions are those whose requests stored each block (session_id)")
        else:
            notes.append("no session_id in the events yet (requests give it as session_id or X-Session-ID)")
        if self.server is None:
            notes.append("without --vllm-url: no capacity, usage, hit rate or flush (the events carry none)")
            flush = False
        else:
            flush = self._resettable() and not self.read_only
            notes.append("unevictable is vLLM's usage gauge (the blocks running requests hold); under load the "
                         "split between evictable and available is a bound (vLLM does not say which cached "
                         "blocks are held)")
            if self.read_only:
                notes.append("read-only: flush refused")
            elif flush:
                notes.append("flush through vLLM's /reset_prefix_cache (it resets only while no block is held)")
            else:
                notes.append(f"no flush: {DEV_MODE_HINT}")
        if self._geometry_note:
            notes.append(self._geometry_note)
        elif not self.bytes_per_token:
            notes.append("bytes per token unknown (give --model)")
        if st.last_seq < 0:
            notes.append(f"no event batch received yet from {self.endpoint}")
        notes += self.health_notes(st)
        return dataclasses.replace(base, flush=flush, read_only=not flush, reason="; ".join(notes) + ".")

    # ----- actions -----

    def _refuse(self, action: str) -> Any:
        raise Unsupported(f"{self.name}: {action} is not possible: {NO_ACTIONS} (flush drops all of it: "
                          "radixtop flush)")

    def flush(self) -> FlushResultView:
        """POST /reset_prefix_cache. vLLM resets only while no running request holds a block and
        answers ``success: false`` otherwise: that is ``flushed=False`` with why. What it frees is
        every cached block (the tree and its copies); the tree itself clears when vLLM publishes
        AllBlocksCleared, with its next engine step."""
        if self.read_only:
            raise read_only(self.name, "flush")
        if self.server is None:
            raise Unsupported(f"{self.name}: flush needs the server's HTTP address (--vllm-url), "
                              "where vLLM resets its cache")
        with self._lock:
            tokens = self._tree.root.subtree_tokens
            block = self._block_size or 1
            cached = tokens + self._tree.copies * block
            nodes = len(self._tree.nodes) - 1
        if not self.server.reset():
            return FlushResultView(0, 0, 0, False, "vLLM refused: running requests hold blocks (it resets its "
                                   "prefix cache only while none does); try again when idle")
        return FlushResultView(cached, nodes, cached * self.bytes_per_token, True,
                               f"flushed: vLLM dropped its prefix cache ({cached:,} tokens); the tree clears when "
                               "vLLM publishes AllBlocksCleared, with its next engine step")

    # ----- the doctor -----

    def diagnose(self, idle_after_s: float = 600.0) -> Diagnosis:
        """vLLM's usage gauge against the tree (the one check its figures allow): blocks held while
        no request runs are leaked (vllm#57336); more cached blocks in the tree than the pool has
        means removals the stream lost."""
        started = time.monotonic()
        skipped = {kind: "vLLM tells no locks, reference counts or closes" for kind in TREE_FINDING_KINDS}
        f = self._figures()
        if f is None or f.usable_blocks is None or f.block_size is None:
            skipped["usage_gauge"] = "needs the server's /metrics (--vllm-url)"
            return Diagnosis(self.name, (), (), skipped, idle_after_s, None, time.monotonic() - started)
        tree = self._tree_blocks()
        findings = usage_findings(f, self.bytes_per_token, tree)  # one read of /metrics, not two
        return Diagnosis(self.name, tuple(findings), ("usage_gauge",), skipped, idle_after_s, None,
                         time.monotonic() - started, notes=(usage_note(f, tree),))

    def _tree_blocks(self) -> tuple[int, int]:
        with self._lock:
            block = self._block_size or 1
            return self._tree.root.subtree_tokens // block, self._tree.copies


def usage_note(f: Figures, tree: tuple[int, int]) -> str:
    """The usage gauge against the tree, by how much they differ and what that means."""
    blocks, copies = tree
    held, cached, bs = f.held_blocks or 0, blocks + copies, f.block_size or 1
    running = "?" if f.running is None else f"{f.running:,}"
    waiting = "?" if f.waiting is None else f"{f.waiting:,}"
    line = (f"vLLM's usage gauge: {held:,} of {f.usable_blocks or 0:,} blocks held by running requests "
            f"({running} running, {waiting} waiting); the tree caches {cached:,} blocks ({copies:,} of them "
            f"copies); they differ by {abs(cached - held):,} blocks ({abs(cached - held) * bs:,} tokens)")
    if cached > held:
        return line + ": cached blocks no request holds, free to vLLM (it evicts them first when it needs room)"
    if held > cached:
        return line + (": blocks running requests hold beyond the cache (their blocks not yet full, not yet "
                       "published)" if f.running else ": held with nothing running (see the finding)")
    return line


def usage_findings(f: Figures, bpt: int, tree: tuple[int, int]) -> list[Finding]:
    """What the usage gauge and the tree (its blocks, and their copies) say together, each with what
    it means; ``bpt``: bytes per token."""
    blocks, copies = tree
    held, usable, bs = f.held_blocks or 0, f.usable_blocks or 0, f.block_size or 1
    figures = {"num_gpu_blocks": f.blocks, "block_size": bs, "kv_cache_usage_perc": f.usage,
               "held_blocks": held, "tree_blocks": blocks, "copies": copies,
               "num_requests_running": f.running, "num_requests_waiting": f.waiting}
    out = []
    if f.running == 0 and f.waiting == 0 and held > 0:
        out.append(Finding(
            "usage_gauge", f"vLLM's usage gauge says {held:,} of {usable:,} blocks are held, with no request "
            f"running or waiting (the tree caches {blocks + copies:,})",
            "blocks no request holds should be free (cached blocks count as free to vLLM): these are leaked by "
            "a request that never released them (vllm#57336), or the gauge is from before the last request ended "
            "(vLLM sets it at each engine step)",
            "read it again after a request; if it stays, report it to vLLM with these figures (a reset cannot "
            "free held blocks)", held * bs, held * bs * bpt, figures=figures))
    if blocks + copies > usable:
        extra = blocks + copies - usable
        out.append(Finding(
            "usage_gauge", f"the tree caches {blocks + copies:,} blocks, {extra:,} more than vLLM's pool has "
            f"({usable:,})", "the stream lost removals (a gap its replay could not close): the tree shows blocks "
            "vLLM no longer caches", "restart radixtop's subscription (the tree is rebuilt from the next reset) "
            "or flush", extra * bs, extra * bs * bpt, figures=figures))
    return out
