"""SGLang's KV events: where a server publishes them (``discover``, from its ``/server_info``) and
its Rust tree core's events in process (``core``). The tree they build, its adapter and the ZMQ
subscriber are engine-neutral: ``radixtop.adapters.events``."""
