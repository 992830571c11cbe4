"""What the tree view shows: expanded nodes, their loaded pages of children, and flat rows.

Pure data (no textual): loads pages through a CacheAdapter-like ``fetch_children`` and flattens
only what the user expanded, so its size follows the screen and the user, not the cache.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from radixtop.adapters.errors import UnknownNode
from radixtop.adapters.model import ROOT_ID, ChainView, ChildrenPage, NodeView

PAGE = 100
CHAIN_HOPS = 10_000

FetchChildren = Callable[[int, int, int, str], ChildrenPage]
FetchChain = Callable[[int, int], ChainView]
FetchPages = Callable[[list[tuple[int, int, int, str]]], list["ChildrenPage | Exception"]]
"""Several children pages in one read (``CacheAdapter.read_many``): a page or the error, in order."""
PAGES_PER_READ = 32  # adapters.base.MAX_READS


@dataclass(frozen=True)
class Row:
    """One line of the tree view."""

    kind: str  # "node", "more" (load the next page), "chain" (a run of single children)
    depth: int
    node: NodeView | None = None
    parent_id: int = ROOT_ID
    more: int = 0
    chain: tuple[NodeView, ...] = ()
    """For "chain": every node of the run, top first; ``node`` is the last one."""
    expanded: bool = False

    @property
    def key(self) -> tuple[str, int]:
        """Stable identity of the row across refreshes (the cursor follows it)."""
        if self.kind == "more":
            return ("more", self.parent_id)
        return ("node", self.node.id)


@dataclass
class _Loaded:
    children: list[NodeView] = field(default_factory=list)
    total: int = 0


class TreeState:
    """Expanded nodes and the children loaded for each; flattens them into rows."""

    def __init__(self, fetch_children: FetchChildren, order: str = "bytes", page: int = PAGE,
                 fetch_chain: FetchChain | None = None, fetch_pages: FetchPages | None = None):
        self.fetch_children = fetch_children
        self.fetch_chain = fetch_chain
        self.fetch_pages = fetch_pages
        self.order = order
        self.page = page
        self.expanded: set[int] = {ROOT_ID}
        self.loaded: dict[int, _Loaded] = {}
        # Chains folded into one row: the top node id -> the chain's nodes, top first.
        self.chains: dict[int, tuple[NodeView, ...]] = {}
        self.rows: list[Row] = []
        self.generation = 0
        """Counts flattens: rows read earlier must not replace rows read later on screen."""

    # ----- loading -----

    def load(self, node_id: int, count: int | None = None, follow_splits: bool = True) -> None:
        """(Re)load the first ``count`` children of ``node_id`` (at least one page)."""
        self._store(node_id, self.fetch_children(node_id, 0, max(count or 0, self.page), self.order),
                    follow_splits)

    def _store(self, node_id: int, page: ChildrenPage, follow_splits: bool) -> None:
        old = self.loaded.get(node_id)
        self.loaded[node_id] = _Loaded(list(page.children), page.total)
        if old is not None and follow_splits:
            self._follow_splits(node_id, old)

    def load_more(self, node_id: int) -> None:
        loaded = self.loaded.get(node_id)
        if loaded is None:
            return self.load(node_id)
        page = self.fetch_children(node_id, len(loaded.children), self.page, self.order)
        seen = {c.id for c in loaded.children}
        loaded.children.extend(c for c in page.children if c.id not in seen)
        loaded.total = page.total

    def _follow_splits(self, node_id: int, old: _Loaded) -> None:
        """A split puts a new head above an expanded child (the tail keeps its id): expand the
        head too, so what the user had open stays open."""
        new_ids = {c.id for c in self.loaded[node_id].children}
        lost = {c.id for c in old.children} - new_ids
        if not lost & self.expanded:
            return
        old_ids = {c.id for c in old.children}
        for child in self.loaded[node_id].children:
            if child.id in old_ids or not child.num_children:
                continue
            below = self.fetch_children(child.id, 0, self.page, self.order).children
            if lost & {c.id for c in below}:
                self.expanded.add(child.id)
                self.load(child.id)

    def wanted(self) -> list[tuple[int, int, int, str]]:
        """The children pages a refresh reads: (node id, offset, limit, order) per expanded node."""
        return [(node_id, 0, max(len(self.loaded.get(node_id, _Loaded()).children), self.page), self.order)
                for node_id in self.expanded if node_id in self.loaded or node_id == ROOT_ID]

    def refresh(self, follow_splits: bool = True,
                prefetched: tuple[list[tuple[int, int, int, str]], list[ChildrenPage | Exception]] | None = None
                ) -> None:
        """Reload every expanded node's pages (as many children as were loaded). A reload after
        a change of sort order compares different pages, so it looks for no splits.
        ``prefetched``: ``wanted()`` and its pages, read earlier by the caller (with other reads)."""
        wanted, pages = prefetched if prefetched is not None else (w := self.wanted(), self._fetch_pages(w))
        for (node_id, *_), page in zip(wanted, pages, strict=True):
            if isinstance(page, (LookupError, UnknownNode)):  # evicted, freed, or the target restarted
                self.forget(node_id)
            elif isinstance(page, Exception):
                raise page
            else:
                self._store(node_id, page, follow_splits)
        self._refresh_chains()
        self.flatten()

    def _refresh_chains(self) -> None:
        """Read every folded chain that shows again, from its top as its parent's page has it
        now: a folded row updates like any other (its tail grows, its subtree and ages move), and
        one no longer a run of single children unfolds."""
        tops = {c.id: c for loaded in self.loaded.values() for c in loaded.children if c.id in self.chains}
        for top_id in list(self.chains):
            top = tops.get(top_id)
            if top is None:  # not on screen (its parent collapsed or it is gone): read when it shows
                continue
            old_end = self.chains[top_id][-1].id
            try:
                chain = self._read_chain(top)
            except (LookupError, UnknownNode):  # evicted between the page and this read
                chain = (top,)
            if len(chain) == 1:
                del self.chains[top_id]
                continue
            self.chains[top_id] = chain
            end = chain[-1].id
            if end != old_end and old_end in self.expanded:  # the tail grew: what was open stays open
                self.expanded.discard(old_end)
                self.expanded.add(end)
                self.load(end, follow_splits=False)

    def _fetch_pages(self, wanted: list[tuple[int, int, int, str]]) -> list[ChildrenPage | Exception]:
        """Every page in ``wanted``: in one read per PAGES_PER_READ where the target can, else
        one by one; a node that is gone gives its error in its place."""
        if self.fetch_pages is not None:
            return [page for start in range(0, len(wanted), PAGES_PER_READ)
                    for page in self.fetch_pages(wanted[start:start + PAGES_PER_READ])]
        pages: list[ChildrenPage | Exception] = []
        for args in wanted:
            try:
                pages.append(self.fetch_children(*args))
            except (LookupError, UnknownNode) as exc:
                pages.append(exc)
        return pages

    def forget(self, node_id: int) -> None:
        self.expanded.discard(node_id)
        self.loaded.pop(node_id, None)
        self.chains.pop(node_id, None)

    # ----- user actions -----

    def toggle(self, node: NodeView) -> None:
        target = self._chain_end(node.id)
        if target in self.expanded:
            self.expanded.discard(target)
        elif node.num_children or target != node.id:
            self.expanded.add(target)
            if target not in self.loaded:
                self.load(target)
        self.flatten()

    def expand(self, node_id: int) -> None:
        self.expanded.add(node_id)
        if node_id not in self.loaded:
            self.load(node_id)

    def collapse(self, node_id: int) -> None:
        self.expanded.discard(self._chain_end(node_id))
        self.flatten()

    def fold_chain(self, node: NodeView) -> int:
        """Follow a run of single children below ``node`` and show it as one row; returns its
        length. Called again on a folded chain, it unfolds it."""
        if node.id in self.chains:
            del self.chains[node.id]
            self.flatten()
            return 0
        chain = self._read_chain(node)
        if len(chain) > 1:
            self.chains[node.id] = chain
            if node.id in self.expanded:
                self.expanded.add(chain[-1].id)
                self.load(chain[-1].id)
        self.flatten()
        return len(chain)

    def _read_chain(self, top: NodeView) -> tuple[NodeView, ...]:
        """``top`` and the run of single children below it, top first."""
        chain = [top]
        if top.num_children == 1 and self.fetch_chain is not None:
            chain.extend(self.fetch_chain(top.id, CHAIN_HOPS - 1).nodes)  # one read
        while chain[-1].num_children == 1 and len(chain) < CHAIN_HOPS:
            page = self.fetch_children(chain[-1].id, 0, 1, self.order)
            if not page.children:
                break
            chain.append(page.children[0])
        return tuple(chain)

    def chain_ids(self) -> set[int]:
        """Every node of the folded chains (a change to any of them changes a row)."""
        return {n.id for chain in self.chains.values() for n in chain}

    def set_order(self, order: str) -> None:
        self.order = order
        self.refresh(follow_splits=False)

    def is_expanded(self, node_id: int) -> bool:
        """Whether ``node_id``'s children show (for the top of a folded chain: its last node's)."""
        return self._chain_end(node_id) in self.expanded

    def _chain_end(self, node_id: int) -> int:
        chain = self.chains.get(node_id)
        return chain[-1].id if chain else node_id

    # ----- rows -----

    def flatten(self) -> list[Row]:
        """Rows for everything expanded, parents before children (iterative: chains are deep)."""
        self.generation += 1
        rows: list[Row] = []
        stack: list[tuple[str, int, int, object]] = [("children", ROOT_ID, 0, None)]
        while stack:
            kind, node_id, depth, payload = stack.pop()
            if kind == "row":
                rows.append(payload)
                continue
            loaded = self.loaded.get(node_id)
            if loaded is None:
                continue
            pending: list[tuple[str, int, int, object]] = []
            for child in loaded.children:
                chain = self.chains.get(child.id)
                end = chain[-1].id if chain else child.id
                expanded = end in self.expanded
                row = (Row("chain", depth, chain[-1], node_id, chain=chain, expanded=expanded) if chain
                       else Row("node", depth, child, node_id, expanded=expanded))
                pending.append(("row", 0, 0, row))
                if end in self.expanded:
                    pending.append(("children", end, depth + 1, None))
            if loaded.total > len(loaded.children):
                pending.append(("row", 0, 0, Row("more", depth, parent_id=node_id,
                                                 more=loaded.total - len(loaded.children))))
            stack.extend(reversed(pending))
        self.rows = rows
        return rows
