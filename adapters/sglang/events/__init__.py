"""A prefix cache kept from its KV events: the wire format (``wire``), the block tree the events
build (``block_tree``), the read-only adapter over it (``adapter``), the ZMQ subscriber
(``zmq``, the only module here that loads pyzmq) and SGLang's Rust tree core in process
(``core``)."""
