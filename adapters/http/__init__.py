"""radixtop's admin API: the FastAPI server, its client (RadixtopClient), request and response
schemas, the wire format, Prometheus metrics and the audit journal."""
