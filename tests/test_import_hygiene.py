"""Layer boundaries: the CLI's start-up and the adapter layer load neither torch nor textual."""

from __future__ import annotations

import subprocess
import sys


def loaded_modules(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys\nprint('\\n'.join(sys.modules))"],
        capture_output=True, text=True, check=True,
    ).stdout
    return set(out.split())


def test_radixtop_help_loads_neither_torch_nor_textual():
    mods = loaded_modules("import sys\nsys.argv=['radixtop','--help']\nfrom cli.main import app\n"
                          "try:\n    app()\nexcept SystemExit:\n    pass")
    assert "typer" in mods
    assert not {"torch", "textual", "uvicorn"} & mods


def test_adapters_load_neither_torch_nor_textual():
    mods = loaded_modules("import adapters")
    assert not {"torch", "textual", "gpu_backend"} & mods


def test_inspector_loads_neither_torch_nor_the_backend():
    mods = loaded_modules("import inspector")
    assert not {"torch", "gpu_backend"} & mods


def test_sglang_adapters_import_sglang_lazily():
    mods = loaded_modules("import adapters.sglang_inproc, adapters.sglang_trees, adapters.owner_queue")
    assert "adapters.sglang_inproc" in mods
    assert not {"torch", "textual", "sglang"} & mods
