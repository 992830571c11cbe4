"""Modal screens: confirm an action (Cancel is the default), ask for a value, help, the doctor."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from rich.console import RenderableType
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Static

from radixtop.inspector.format import literal

_MODAL_CSS = """
{name} {{ align: center middle; }}
{name} > Vertical {{
    width: 90; max-width: 95%; height: auto; max-height: 90%;
    border: thick $accent; background: $surface; padding: 1 2;
}}
{name} .title {{ text-style: bold; margin-bottom: 1; }}
{name} VerticalScroll {{ height: auto; max-height: 20; }}
{name} Horizontal {{ height: auto; margin-top: 1; align-horizontal: right; }}
{name} Button {{ margin-left: 2; }}
{name} Input {{ margin-top: 1; }}
"""


class ConfirmScreen(ModalScreen[bool]):
    """Shows what an action will do; returns True only on an explicit confirm.

    With ``require_text`` the confirm button stays disabled until that text is typed (large or
    bulk actions) in the field, which has the focus; Enter there confirms once it matches.
    Escape, Cancel and Enter on the focused Cancel button (without a field) all cancel.
    """

    DEFAULT_CSS = _MODAL_CSS.format(name="ConfirmScreen")
    BINDINGS = [Binding("escape", "cancel", "Cancel", id="modal.cancel")]

    def __init__(self, title: str, body: RenderableType, confirm_label: str, require_text: str | None = None):
        super().__init__()
        self.title_text = title
        self.body = body
        self.confirm_label = confirm_label
        self.require_text = require_text

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(self.title_text, classes="title")
            with VerticalScroll():
                yield Static(self.body)
            if self.require_text is not None:
                yield Static(f"Type [b]{self.require_text}[/] to confirm.")
                yield Input(placeholder=self.require_text, id="confirm-text")
            with Horizontal():
                yield Button("Cancel", id="cancel", variant="primary")
                yield Button(self.confirm_label, id="confirm", variant="error",
                             disabled=self.require_text is not None)

    def on_mount(self) -> None:
        # Where the operator must type the value, the field has the focus (Enter there confirms
        # once it matches); otherwise Cancel does, so a stray Enter changes nothing.
        if self.require_text is not None:
            self.query_one("#confirm-text", Input).focus()
        else:
            self.query_one("#cancel", Button).focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        self.query_one("#confirm", Button).disabled = event.value.strip() != self.require_text

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.value.strip() == self.require_text:
            self.dismiss(True)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "confirm")

    def action_cancel(self) -> None:
        self.dismiss(False)


class AskScreen(ModalScreen[str | None]):
    """One line of input (search text, a token count); Escape cancels."""

    DEFAULT_CSS = _MODAL_CSS.format(name="AskScreen")
    BINDINGS = [Binding("escape", "cancel", "Cancel", id="ask.cancel")]

    def __init__(self, title: str, hint: str, placeholder: str = "", value: str = ""):
        super().__init__()
        self.title_text = title
        self.hint = hint
        self.placeholder = placeholder
        self.value = value

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(self.title_text, classes="title")
            yield Static(self.hint)
            yield Input(value=self.value, placeholder=self.placeholder, id="ask-input")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value)

    def action_cancel(self) -> None:
        self.dismiss(None)


def help_text(bindings: Iterable[Binding], keymap: Mapping[str, str], key_display: Callable[[Binding], str]) -> str:
    """One line per binding id: its keys as bound now (``keymap`` remaps an id to its first key
    there), written by ``key_display`` as people write keys (``?``, ``]``, ``^c``), what it does,
    and the id ``--keymap`` takes. Bindings without an id or a description are not listed."""
    keys: dict[str, list[str]] = {}
    described: dict[str, str] = {}
    for b in Binding.make_bindings(bindings):
        if b.id is None or not b.description:
            continue
        remapped = keymap.get(b.id)
        if remapped is not None:
            b = b.with_key(remapped.split(",")[0].strip())
        shown = key_display(b)
        if shown not in keys.setdefault(b.id, []):
            keys[b.id].append(shown)
        described.setdefault(b.id, b.description)
    return "\n".join(f"[b]{literal(' '.join(keys[i]).rjust(16))}[/]  {literal(described[i])}  [dim]({i})[/]"
                     for i in keys)


class HelpScreen(ModalScreen[None]):
    """Every key, from the bindings themselves (so remapped keys show as remapped)."""

    DEFAULT_CSS = _MODAL_CSS.format(name="HelpScreen")
    BINDINGS = [Binding("escape,q,question_mark", "close", "Close", id="help.close")]

    def __init__(self, text: str):
        super().__init__()
        self.text = text

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static("radixtop keys", classes="title")
            with VerticalScroll():
                yield Static(self.text)
            yield Static("[dim]escape, q or ? closes · ↑ ↓ PgUp PgDn scroll · ctrl+p opens the command palette · "
                         "radixtop --keymap ID=KEY,... remaps[/]")

    def action_close(self) -> None:
        self.dismiss(None)


class _ReportScreen(ModalScreen[None]):
    """A report in a modal, scrolled. Plain text: it quotes the target's ids, shown as written
    (never read as markup)."""

    heading_text = ""
    report_id = ""
    footer = ""

    def __init__(self, text: str):
        super().__init__()
        self.text = text

    def heading(self) -> str:
        return self.heading_text

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(self.heading(), classes="title", markup=False)
            with VerticalScroll():
                yield Static(self.text, markup=False, id=self.report_id)
            yield Static(self.footer, markup=False)

    def action_close(self) -> None:
        self.dismiss(None)


class DoctorScreen(_ReportScreen):
    """The leak doctor's findings, each with what it means and what fixes it."""

    DEFAULT_CSS = _MODAL_CSS.format(name="DoctorScreen") + "DoctorScreen VerticalScroll { max-height: 32; }\n"
    BINDINGS = [Binding("escape,q,D", "close", "Close", id="doctor.close")]
    report_id = "doctor-report"
    footer = "escape, q or D closes · ↑ ↓ PgUp PgDn scroll · radixtop doctor prints the same"

    def __init__(self, text: str, healthy: bool):
        super().__init__(text)
        self.healthy = healthy

    def heading(self) -> str:
        return "Leak doctor: " + ("nothing found" if self.healthy else "findings")


class WhyScreen(_ReportScreen):
    """Why a prompt missed (``radixtop why``): what is cached, where it leaves the cached path, and
    what of the rest was cached before, when and why it left."""

    DEFAULT_CSS = _MODAL_CSS.format(name="WhyScreen") + "WhyScreen VerticalScroll { max-height: 32; }\n"
    BINDINGS = [Binding("escape,q,w", "close", "Close", id="why.close")]
    heading_text = "Why did this prompt miss?"
    report_id = "why-report"
    footer = "escape, q or w closes · ↑ ↓ PgUp PgDn scroll · radixtop why prints the same"

    def __init__(self, text: str, heading: str = "", footer: str = "") -> None:
        super().__init__(text)
        if heading:
            self.heading_text = heading
        if footer:
            self.footer = footer
