"""Optional dependencies: without ``radixtop[kv-events]`` the KV-event target says, in one line,
which extra to install (the wheel check in .ci/wheel-check runs the same without the packages)."""

from __future__ import annotations

import subprocess
import sys

import pytest

BLOCKED = "import sys\nsys.modules[{name!r}] = None  # as if not installed\n"


def run_without(module: str, *args: str) -> subprocess.CompletedProcess:
    code = BLOCKED.format(name=module) + (
        f"sys.argv = ['radixtop', *{list(args)!r}]\nfrom radixtop.cli.main import main\nmain()\n")
    return subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("module", ["zmq", "msgspec"])
@pytest.mark.parametrize("command", [["serve"], ["tui"]])
def test_kv_events_without_the_extra_is_one_line_naming_it(module, command):
    done = run_without(module, *command, "--kv-events", "tcp://127.0.0.1:5557")
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr == (f"radixtop: --kv-events needs {module}, which is not installed: "
                           "pip install 'radixtop[kv-events]'\n")


def test_tokenizer_goes_with_kv_events_and_loads_from_local_files(tmp_path):
    """--tokenizer: a one-line error where it does not apply or cannot load; a local Hugging Face
    tokenizer loads (nothing downloaded)."""
    import subprocess
    import sys

    def radixtop(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-P", "-m", "radixtop.cli.main", *args], capture_output=True,
                              text=True, timeout=60)

    for command in (["tui"], ["serve"], ["tui", "--url", "http://127.0.0.1:9"]):
        done = radixtop(*command, "--tokenizer", str(tmp_path))
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert "--tokenizer goes with --kv-events" in done.stderr
    # In a child: importing transformers here, before the suite's SGLang stand-ins are in place,
    # would spoil the later SGLang imports of this process.
    script = f"""
import sys
from radixtop.cli.targets import load_tokenizer
try:
    load_tokenizer({str(tmp_path / "nothing-here")!r})
except ValueError as exc:
    assert "cannot load the tokenizer" in str(exc) and "\\n" not in str(exc), exc
else:
    sys.exit("a missing tokenizer loaded")
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
words = Tokenizer(models.WordLevel({{"[UNK]": 0, "hello": 1, "cache": 2}}, unk_token="[UNK]"))
words.pre_tokenizer = pre_tokenizers.Whitespace()
PreTrainedTokenizerFast(tokenizer_object=words, unk_token="[UNK]").save_pretrained({str(tmp_path / "words")!r})
assert load_tokenizer({str(tmp_path / "words")!r}).decode([1, 2]) == "hello cache"
print("ok")
"""
    done = subprocess.run([sys.executable, "-P", "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]
