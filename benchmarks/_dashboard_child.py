"""A dashboard in a process of its own (what `radixtop` runs): RadixtopApp headless at 160x48 over
an RadixtopClient for a number of seconds (or until SIGUSR1); prints its poll count as JSON. Used by
bench_dashboard."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


async def main(url: str, token: str, seconds: float, interval: float) -> None:
    from radixtop.adapters.http.client import RadixtopClient
    from radixtop.inspector.app import RadixtopApp

    adapter = RadixtopClient(url, token=token, timeout=10)
    app = RadixtopApp(adapter, target=url, interval=interval)
    done = asyncio.Event()  # SIGUSR1: stop now (before ``seconds``) and report
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, done.set)
    async with app.run_test(size=(160, 48)):
        try:
            await asyncio.wait_for(done.wait(), seconds)
        except TimeoutError:
            pass
        print(json.dumps({"polls": app.home.polls, "down": app.home.down}), flush=True)
    adapter.release()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])))
