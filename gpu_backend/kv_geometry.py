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


CACHE_DTYPES = {"fp8": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2",
                "half": "float16", "float16": "float16", "bfloat16": "bfloat16", "float": "float32",
                "float32": "float32"}
"""A server's KV-cache dtype names (vLLM's ``--kv-cache-dtype``, SGLang's alike) -> ours; ``auto``
is the model's own dtype."""


def from_hf_config(config: dict, name: str, cache_dtype: str = "auto", page_size: int = 1) -> KVGeometry:
    """The KV geometry of a Hugging Face ``config.json`` (``text_config`` where a multimodal model
    keeps it) for attention with K and V per KV head: layers x 2 x KV heads x head_dim. ValueError,
    in one line, where the config says something else (MLA's latent cache) or lacks a figure."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    if "kv_lora_rank" in text:
        raise ValueError(f"{name}: MLA (kv_lora_rank) keeps a latent KV cache radixtop does not size yet")
    try:
        layers, heads = int(text["num_hidden_layers"]), int(text["num_attention_heads"])
        kv_heads = int(text.get("num_key_value_heads") or heads)
        head_dim = int(text.get("head_dim") or int(text["hidden_size"]) // heads)
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
        raise ValueError(f"{name}: config.json lacks the attention figures ({type(exc).__name__}: {exc})") from None
    model_dtype = str(text.get("torch_dtype") or text.get("dtype") or config.get("torch_dtype") or "bfloat16")
    dtype = CACHE_DTYPES.get(model_dtype if cache_dtype == "auto" else cache_dtype)
    if dtype is None:
        raise ValueError(f"{name}: unknown KV cache dtype {cache_dtype if cache_dtype != 'auto' else model_dtype!r}")
    return KVGeometry(name, layers, kv_heads, head_dim, dtype, page_size)


def from_model_folder(model: str, cache_dtype: str = "auto", page_size: int = 1) -> KVGeometry:
    """The KV geometry of a model folder (its ``config.json``) or of that file; ValueError in one
    line where it cannot be read or sized."""
    import json
    from pathlib import Path

    path = Path(model)
    path = path / "config.json" if path.is_dir() else path
    try:
        config = json.loads(path.read_text()[: 4 * 2**20])
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read the model's config {str(path)!r}: {type(exc).__name__}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{str(path)!r} is not a model config (not a JSON object)")
    return from_hf_config(config, path.resolve().parent.name, cache_dtype, page_size)
