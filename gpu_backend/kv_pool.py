"""MHA KV pool: real K and V tensors per layer, on cuda, cpu, or meta (geometry without memory)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch

from radixtop.gpu_backend.allocator import TokenToKVPoolAllocator
from radixtop.gpu_backend.kv_geometry import KVGeometry

_TORCH_DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
}


DEVICES = ("cpu", "cuda", "meta")
MAX_POOL_BYTES = 2**63 - 1
"""Token and byte figures are int64 everywhere past the pool (API, metrics, export)."""


class KVPoolError(ValueError):
    """A KV pool that cannot be made here: an unknown or absent device, or more memory than the
    device has (or than 64 bits can count)."""


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


DEVICE_CHOICES = ("auto", *DEVICES)
"""What a command's --device takes: a pool's device, or auto (``pick_device``)."""
AUTO_CPU_MAX_BYTES = 1 << 30
"""With --device auto and no GPU, a pool up to this size is real tensors on cpu; a larger one is meta."""


def check_device_choice(device: str) -> None:
    """KVPoolError where ``device`` is not one of DEVICE_CHOICES."""
    if device not in DEVICE_CHOICES:
        raise KVPoolError(f"unknown device {device!r}; use {', '.join(DEVICE_CHOICES[:-1])} or {DEVICE_CHOICES[-1]}")


def pick_device(device: str, pool_bytes: int) -> str:
    """``device`` as given; for auto: cuda where there is one, else cpu for a pool of
    ``pool_bytes`` up to AUTO_CPU_MAX_BYTES, else meta (geometry only, no memory)."""
    if device != "auto":
        return device
    if torch.cuda.is_available():
        return "cuda"
    return "cpu" if pool_bytes <= AUTO_CPU_MAX_BYTES else "meta"


def pool_device(name: str) -> torch.device:
    """``name`` as a torch device, if a pool can live there."""
    try:
        device = torch.device(name)
    except RuntimeError:
        device = None
    if device is None or device.type not in DEVICES:
        raise KVPoolError(f"unknown device {name!r}; use {', '.join(DEVICES[:-1])} or {DEVICES[-1]}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise KVPoolError("device cuda: CUDA is not available here (no GPU, or a torch built without it); "
                          "use cpu or meta")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise KVPoolError(f"device {name}: there are {torch.cuda.device_count()} CUDA devices")
    return device


def available_bytes(device: torch.device) -> int | None:
    """Memory a pool could take on ``device`` now; None on meta, where it takes none."""
    if device.type == "meta":
        return None
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:  # MemAvailable counts the page cache the kernel would give back; free memory does not
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


@dataclass(frozen=True)
class PoolMemory:
    """Memory figures of a pool, in tokens and bytes."""

    capacity_tokens: int
    used_tokens: int
    free_tokens: int
    bytes_per_token: int

    @property
    def capacity_bytes(self) -> int:
        return self.capacity_tokens * self.bytes_per_token

    @property
    def used_bytes(self) -> int:
        return self.used_tokens * self.bytes_per_token

    @property
    def free_bytes(self) -> int:
        return self.free_tokens * self.bytes_per_token


class MHATokenToKVPool:
    """K and V buffers of shape (size + page_size, kv_heads, head_dim) for each layer.

    Row 0 is SGLang's padding slot. On ``meta`` the tensors have shapes but no storage, so a
    geometry as large as a real GPU's can be simulated on any machine; writes there are no-ops.
    """

    def __init__(self, geometry: KVGeometry, size: int, device: str | None = None):
        self.geometry = geometry
        self.size = size
        self.device = pool_device(device or default_device())
        rows = size + geometry.page_size
        if rows * geometry.bytes_per_token > MAX_POOL_BYTES:
            raise KVPoolError(f"a KV pool of {size:,} tokens of {geometry.name}: its bytes do not fit in 64 bits")
        gib = f"{rows * geometry.bytes_per_token / 2**30:,.1f} GiB"
        room = available_bytes(self.device)
        if room is not None and rows * geometry.bytes_per_token > room:
            raise KVPoolError(f"a KV pool of {gib} on {self.device}: more than the {room / 2**30:,.1f} GiB "
                              "of memory available (a smaller capacity, or the meta device)")
        dtype = _TORCH_DTYPES[geometry.dtype]
        shape = (rows, geometry.num_kv_heads, geometry.head_dim)
        try:
            self.k_buffer = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(geometry.num_layers)]
            self.v_buffer = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(geometry.num_layers)]
        except RuntimeError as exc:  # torch.OutOfMemoryError is one
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise KVPoolError(f"cannot allocate a KV pool of {gib} on {self.device}: {reason}") from None

    @property
    def is_simulated(self) -> bool:
        return self.device.type == "meta"

    def buffer_bytes(self) -> int:
        """Bytes the K and V buffers take (what they would take, on meta)."""
        return sum(t.numel() * t.element_size() for t in (*self.k_buffer, *self.v_buffer))

    def set_kv_buffer(self, layer_id: int, slots: np.ndarray, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write K and V for ``slots`` of one layer (what the attention kernel does after a forward)."""
        if self.is_simulated or len(slots) == 0:
            return
        index = torch.from_numpy(np.ascontiguousarray(slots)).to(self.device)
        self.k_buffer[layer_id].index_copy_(0, index, k.to(self.k_buffer[layer_id].dtype))
        self.v_buffer[layer_id].index_copy_(0, index, v.to(self.v_buffer[layer_id].dtype))

    def get_kv(self, layer_id: int, slots: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        index = torch.from_numpy(np.ascontiguousarray(slots)).to(self.device)
        return self.k_buffer[layer_id].index_select(0, index), self.v_buffer[layer_id].index_select(0, index)


class KVPool:
    """An allocator and the tensors it indexes, with memory figures in tokens and bytes."""

    def __init__(self, geometry: KVGeometry, size: int, device: str | None = None):
        self.geometry = geometry
        self.allocator = TokenToKVPoolAllocator(size, geometry.page_size)
        self.kv = MHATokenToKVPool(geometry, size, device)

    def memory(self) -> PoolMemory:
        free = self.allocator.available_size()
        return PoolMemory(
            capacity_tokens=self.allocator.size,
            used_tokens=self.allocator.size - free,
            free_tokens=free,
            bytes_per_token=self.geometry.bytes_per_token,
        )

    def write_tokens(self, slots: np.ndarray, token_ids: list[int] | np.ndarray) -> None:
        """Stand-in for a forward pass: K/V for each token, derived from its id, into every layer."""
        if self.kv.is_simulated or len(slots) == 0:
            return
        g = self.geometry
        ids = torch.as_tensor(np.asarray(token_ids, dtype=np.float32), device=self.kv.device)
        k = ids.view(-1, 1, 1).expand(-1, g.num_kv_heads, g.head_dim)
        for layer in range(g.num_layers):
            self.kv.set_kv_buffer(layer, slots, k + layer, -k - layer)
