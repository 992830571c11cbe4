"""How `radixtop serve` stops: SIGTERM (what systemd, docker and kill send) and Ctrl-C both end it
cleanly with exit 0, as a server is meant to stop (it ended by the signal, status 143)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from tests.support.live_server import free_port


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_serve_stops_cleanly_on_a_signal(sig):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-P", "-m", "radixtop.cli.main", "serve", "--port", str(port),
                             "--model", "tiny", "--capacity", "4096", "--device", "cpu"],
                            env={**os.environ, "RADIXTOP_TOKEN": "stop-test-token-0123456789"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.2)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, (proc.returncode, err)
    assert "Traceback" not in err
