"""KV geometry of a model (layers, kv heads, head dim, dtype, page size) and named presets."""

from __future__ import annotations

from dataclasses import dataclass, replace

_DTYPE_SIZES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}


@dataclass(frozen=True)
class KVGeometry:
    """Shape of one token's K and V across all layers; bytes per token follow from it."""

    name: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str = "bfloat16"
    page_size: int = 1

    def __post_init__(self) -> None:
        if self.dtype not in _DTYPE_SIZES:
            raise ValueError(f"unknown KV dtype {self.dtype!r}; known: {', '.join(_DTYPE_SIZES)}")
        for field in ("num_layers", "num_kv_heads", "head_dim", "page_size"):
            if getattr(self, field) < 1:
                raise ValueError(f"{field} must be >= 1, got {getattr(self, field)}")

    @property
    def dtype_size(self) -> int:
        return _DTYPE_SIZES[self.dtype]

    @property
    def bytes_per_token(self) -> int:
        """K and V for every layer: layers x 2 x kv_heads x head_dim x dtype size."""
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim * self.dtype_size

    def with_page_size(self, page_size: int) -> KVGeometry:
        return replace(self, page_size=page_size)


PRESETS: dict[str, KVGeometry] = {
    g.name: g
    for g in (
        KVGeometry("llama-3-8b", num_layers=32, num_kv_heads=8, head_dim=128),
        KVGeometry("llama-3-70b", num_layers=80, num_kv_heads=8, head_dim=128),
        KVGeometry("qwen2.5-7b", num_layers=28, num_kv_heads=4, head_dim=128),
        KVGeometry("qwen2.5-0.5b", num_layers=24, num_kv_heads=2, head_dim=64),
        # Small enough that a CPU pool of real tensors costs almost nothing in tests.
        KVGeometry("tiny", num_layers=2, num_kv_heads=2, head_dim=8, dtype="float32"),
    )
}


def get_geometry(name: str, page_size: int = 1) -> KVGeometry:
    try:
        return PRESETS[name].with_page_size(page_size)
    except KeyError:
        raise ValueError(f"unknown model preset {name!r}; known: {', '.join(PRESETS)}") from None
