"""KeysFooter: the footer, cut by importance where the screen is narrow (quit and help always show)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import Footer
from textual.widgets._footer import FooterKey

DROPPED_FIRST = ("tree.chain", "tree.order", "sessions.select", "sessions.mark", "sessions.reverse", "tree.toggle",
                 "sessions.sort", "app.pause", "app.search", "fleet.refresh", "app.filter", "tree.pane",
                 "sessions.pane", "app.flush", "app.evict", "app.close")
"""Bindings the footer leaves out first, in this order, until the rest fits; then any other but
``KEEP`` (a binding added later, from the last)."""
KEEP = frozenset({"app.quit", "app.help"})
"""How to leave, and how to find every key: always shown."""


class KeysFooter(Footer):
    """Textual's Footer, one key per action, in the bindings' order; on a narrow screen the least
    needed keys leave it (``DROPPED_FIRST``, then any but ``KEEP``) rather than the last ones being cut
    at the edge."""

    def _fitting(self, keys: list[tuple[Binding, bool, str]]) -> list[tuple[Binding, bool, str]]:
        width = self.size.width or self.app.size.width

        def cost(item: tuple[Binding, bool, str]) -> int:
            binding = item[0]
            return len(self.app.get_key_display(binding)) + 1 + len(binding.description) + 1  # + the gap

        total = sum(map(cost, keys))
        ranked = {name: rank for rank, name in enumerate(DROPPED_FIRST)}
        droppable = sorted((k for k in keys if k[0].id not in KEEP),
                           key=lambda k: (ranked.get(k[0].id, len(ranked)), -keys.index(k)))
        for item in droppable:
            if total <= width:
                break
            keys.remove(item)
            total -= cost(item)
        return keys

    def compose(self) -> ComposeResult:
        if not self._bindings_ready:
            return
        first: dict[str, tuple[Binding, bool, str]] = {}  # one key per action, as Textual's footer
        for _, binding, enabled, tooltip in self.screen.active_bindings.values():
            if binding.show:
                first.setdefault(binding.action, (binding, enabled, tooltip))
        keys = self._fitting(list(first.values()))
        self.styles.grid_size_columns = len(keys)
        for binding, enabled, tooltip in keys:
            yield FooterKey(binding.key, self.app.get_key_display(binding), binding.description, binding.action,
                            disabled=not enabled, tooltip=tooltip).data_bind(compact=Footer.compact)

    def on_resize(self) -> None:
        if self._bindings_ready:
            self.call_after_refresh(self.recompose)
