"""A prefix cache kept from its KV events, SGLang's or vLLM's: the wire format (``wire``), the
block tree the events build (``block_tree``) and its sessions' figures (``figures``), the read-only
adapter over it (``adapter``) and the ZMQ subscriber (``zmq``, the only module here that loads
pyzmq)."""
