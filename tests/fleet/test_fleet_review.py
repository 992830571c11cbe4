"""A fleet source or a worker that answers something unexpected costs a row or a note, never the
poll: a worker URL radixtop cannot read, a malformed or cyclic Dynamo dump, a guessed radixtop URL
(no engine's API key goes there; the plugin's name is matched exactly), and readers during a poll."""

from __future__ import annotations

from radixtop.adapters.fleet import probe
from radixtop.adapters.fleet.sources import Discovery, Mapping, SmgSource, Source


def test_an_smg_worker_that_is_not_http_is_skipped_with_a_note():
    from fastapi import FastAPI

    from tests.support.live_server import running_server

    entries = [{"url": "http://10.9.9.9:30000", "model_id": "m", "is_healthy": True},
               {"url": "grpc://10.9.9.8:30000", "model_id": "m", "is_healthy": True}]
    gateway = FastAPI()
    gateway.get("/workers")(lambda: {"workers": entries, "total": 2, "stats": {}})
    gateway.get("/get_loads")(lambda: {"loads": [{"worker": "grpc://10.9.9.8:30000", "dp_rank": 0},
                                                {"worker": "http://10.9.9.9:30000", "num_running_reqs": 3}]})
    with running_server(gateway) as url:
        view = probe.poll_fleet(SmgSource(url, Mapping({}, None)), timeout=0.3)
    assert not view.error
    assert [(r.worker, r.running_requests) for r in view.rows] == [("http://10.9.9.9:30000", 3)]
    assert any("grpc://10.9.9.8:30000" in n and "not an http(s) URL" in n for n in view.notes)


def test_a_source_that_raises_is_the_views_error():
    class Broken(Source):
        label = "broken"

        def discover(self) -> Discovery:
            raise RuntimeError("boom")

    view = probe.poll_fleet(Broken(), timeout=0.2)
    assert view.rows == () and "boom" in view.error
