"""radixtop's admin API, both ends and what they share.

- client side: ``client`` (RadixtopClient, the adapter contract over HTTP) and ``proxy`` (which
  proxy a URL goes through; also SGLang's and the fleet's HTTP);
- shared: ``wire`` (views to JSON and back, the error body), ``params`` (parameters as the
  contract's arguments, one parser for both ends) and ``schemas`` (the OpenAPI models);
- server: ``server/`` (FastAPI under uvicorn: ``create_app``, its reads and actions routers, the
  edge, the protocol, the audit journal, Prometheus metrics, ``serve``). Only the commands and the
  SGLang plugin import it; the client side never loads it, nor fastapi (import-linter).
"""
