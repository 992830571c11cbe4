"""A real inference server run by the tests as a child process group (SGLang's, vLLM's): reading
its Prometheus text, and stopping it with nothing of its group left behind."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import httpx

_SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{.*\})?\s+(\S+)")


def metric_totals(text: str) -> dict[str, float]:
    """Each sample of a /metrics text summed over its label sets (one scheduler or engine here)."""
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        match = _SAMPLE.match(line)
        if match:
            totals[match.group(1)] = totals.get(match.group(1), 0.0) + float(match.group(2))
    return totals


def terminate(proc: subprocess.Popen, timeout: float = 30.0) -> None:
    """SIGTERM, and SIGKILL after ``timeout`` s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def stop_group(proc: subprocess.Popen, what: str, timeout: float = 60.0) -> None:
    """SIGTERM to the launcher (its own process group's leader); then nothing of its group may be left."""
    terminate(proc, timeout)
    deadline = time.monotonic() + 30
    while group_alive(proc.pid):
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            raise AssertionError(f"{what}: processes left after the launcher ended")
        time.sleep(0.2)


def group_alive(pgid: int) -> bool:
    """Whether a live (not zombie) process of group ``pgid`` is left."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
    return False


def wait_healthy(proc: subprocess.Popen, client: httpx.Client, urls: list[str], timeout: float) -> None:
    """Until each of ``urls`` answers 200 in turn, all within ``timeout`` s; RuntimeError if the
    process ends first, TimeoutError if one never answers."""
    deadline = time.monotonic() + timeout
    for url in urls:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"exited with {proc.returncode}")
            try:
                if client.get(url, timeout=2.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"no answer on {url} within {timeout:g}s")
            time.sleep(0.25)
