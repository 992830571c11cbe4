"""What the command loads at start: `radixtop --help` answers without torch, textual or uvicorn.

(The layers themselves are checked by import-linter's contracts in pyproject.toml; this checks
what runs, which includes imports deferred into functions.)
"""

from __future__ import annotations

from tests.support.modules import loaded_modules


def test_radixtop_help_loads_neither_torch_nor_textual():
    mods = loaded_modules("import sys\nsys.argv=['radixtop','--help']\nfrom radixtop.cli.main import app\n"
                          "try:\n    app()\nexcept SystemExit:\n    pass")
    assert "typer" in mods and "radixtop.cli.main" in mods
    assert not {"torch", "textual", "uvicorn", "sglang"} & mods


def test_the_sglang_adapters_import_sglang_and_torch_lazily():
    """The plugin module is imported in every SGLang process: it must cost nothing until used."""
    mods = loaded_modules("import radixtop.adapters.sglang.plugin, radixtop.adapters.sglang.inproc, "
                          "radixtop.adapters.sglang.trees")
    assert "radixtop.adapters.sglang.inproc" in mods
    assert not {"torch", "textual", "sglang"} & mods
