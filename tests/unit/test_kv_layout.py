"""`kv_layout_of` reads a KV cache config by class names and attributes that vLLM 0.32 and
0.34 share (v1/kv_cache_interface.py), so a stand-in shaped like their objects is enough:
here Flash-Next's six groups as both versions build them on the CPU rule (BF16, 1,664-token
blocks, measured on the meta engine: benchmarks/results/flash-next.md, "vLLM 0.34")."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine_adapter.vllm_local import kv_layout_of


@dataclass(frozen=True)
class MambaSpec:
    block_size: int
    page_size_bytes: int
    mamba_cache_mode: str = "align"


@dataclass(frozen=True)
class FullAttentionSpec:
    block_size: int
    page_size_bytes: int


@dataclass(frozen=True)
class MLAAttentionSpec(FullAttentionSpec):
    pass


@dataclass(frozen=True)
class CircularBufferSpec:
    block_size: int
    page_size_bytes: int


@dataclass(frozen=True)
class UniformTypeKVCacheSpecs:
    block_size: int
    kv_cache_specs: dict[str, Any]


@dataclass(frozen=True)
class HiSparseHotSpec:
    block_size: int
    page_size_bytes: int


@dataclass
class Group:
    layer_names: list[str]
    kv_cache_spec: Any


@dataclass
class Tensor:  # KVCacheTensor of 0.32 and 0.34
    size: int
    layers: list[str]
    layer_stride: int
    block_stride: int
    offset: int = 0
    host_resident: bool = False


@dataclass
class Config:
    num_blocks: int
    kv_cache_tensors: list[Tensor]
    kv_cache_groups: list[Group] = field(default_factory=list)


BS, MAMBA_PAGE, KV_PAGE, COMPRESSED_PAGE = 1664, 3_407_872, 3_407_872, 106_496
BLOCK = 12 * (KV_PAGE + COMPRESSED_PAGE)  # one block id: 12 QSA layers' K/V and compressed keys


def flash_next(extra_tensors: list[Tensor] | None = None) -> Config:
    def names(prefix: str, n: int) -> list[str]:
        return [f"{prefix}.{i}" for i in range(n)]

    groups = [Group(names(f"gdn{g}", 12), MambaSpec(BS, MAMBA_PAGE)) for g in range(3)]
    groups.append(Group(["ple"], MambaSpec(BS, MAMBA_PAGE)))
    groups.append(Group(names("ring", 12), CircularBufferSpec(4, 1024)))
    attention = {n: FullAttentionSpec(BS, KV_PAGE) for n in names("kv", 12)}
    attention |= {n: MLAAttentionSpec(BS, COMPRESSED_PAGE) for n in names("ck", 12)}
    groups.append(Group(list(attention), UniformTypeKVCacheSpecs(BS, attention)))
    # Block-outermost (BLNHC): views of one allocation, each layer's page strided by the block.
    tensors = [Tensor(size=50 * BLOCK, layers=names("kv", 12), layer_stride=KV_PAGE, block_stride=BLOCK)]
    return Config(num_blocks=50, kv_cache_tensors=tensors + (extra_tensors or []), kv_cache_groups=groups)


def test_flash_next_groups_and_block_cost_as_vllm_builds_them() -> None:
    layout = kv_layout_of(flash_next())
    assert layout["num_blocks"] == 50
    assert layout["bytes_per_block"] == 42_172_416
    kinds = [(g["kind"], g["num_layers"], g["block_size"]) for g in layout["groups"]]
    assert kinds == [("linear_attention", 12, BS)] * 3 + [
        ("linear_attention", 1, BS),
        ("ring", 12, 4),
        ("full_attention", 24, BS),
    ]
    assert layout["groups"][5]["spec"] == "FullAttentionSpec+MLAAttentionSpec"
    assert layout["groups"][5]["page_bytes_per_layer"] == KV_PAGE
    assert layout["groups"][0]["mamba_cache_mode"] == "align"


def test_a_host_resident_tensor_is_not_the_block_pool() -> None:
    host = Tensor(size=10**12, layers=["hot"], layer_stride=1, block_stride=1, host_resident=True)
    assert kv_layout_of(flash_next([host]))["bytes_per_block"] == 42_172_416


def test_an_unknown_spec_class_is_named_not_guessed() -> None:
    config = flash_next()
    config.kv_cache_groups.append(Group(["hot"], HiSparseHotSpec(BS, 1)))
    assert kv_layout_of(config)["groups"][-1]["kind"] == "HiSparseHotSpec"
