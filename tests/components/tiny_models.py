"""Tiny architectures and scenarios built directly from the dataclasses, small enough to count by hand."""
from __future__ import annotations

from dataclasses import replace

from nnmem_sweep import columns as C
from nnmem_sweep.models.arch import Architecture
from nnmem_sweep.scenario import GPUSpec, Overheads, Scenario

# Llama-style: h 8, 2 layers, 2 heads of 4, 1 KV head (GQA), SwiGLU 16, vocab 32, RMSNorm, untied.
# Parameters: embed 32·8 = 256; per layer: 2 norms 16, q 8·8 = 64, k 4·8 = 32, v 32, o 64, gate/up/down 3·128 = 384
# -> 592 per layer, 1184 for 2; final norm 8; lm_head 256. Total 256 + 1184 + 8 + 256 = 1704.
TINY_LLAMA = Architecture(
    name="tiny-llama", kind="transformer", family="llama", hidden=8, layers=2, heads=2, kv_heads=1, head_dim=4,
    intermediate=16, vocab=32, max_position=64, mlp="gated", activation="silu", norm="rmsnorm", position="rope",
    head="causal_lm", params=1704,
)
TINY_LLAMA_PARAMS = 1704

# GPT-2 style: h 8, 2 layers, 2 heads, GeLU MLP 32, vocab 32, 16 positions, LayerNorm, dropout, tied head.
# Parameters: wte 256 + wpe 16·8 = 128; per layer: 2 LayerNorms 4·8 = 32, q/k/v 3·(64 + 8) = 216, o 64 + 8 = 72,
# up 32·8 + 32 = 288, down 8·32 + 8 = 264 -> 872, 1744 for 2; final LayerNorm 16. Total 256 + 128 + 1744 + 16 = 2144.
TINY_GPT2 = Architecture(
    name="tiny-gpt2", kind="transformer", family="gpt2", hidden=8, layers=2, heads=2, kv_heads=2, head_dim=4,
    intermediate=32, vocab=32, max_position=16, tied_embeddings=True, mlp="gelu", activation="gelu",
    norm="layernorm", position="learned", qkv_bias=True, attn_out_bias=True, mlp_bias=True, norm_bias=True,
    attn_dropout=0.1, hidden_dropout=0.1, head="causal_lm", params=2144,
)
TINY_GPT2_PARAMS = 2144

ZERO_OVERHEADS = Overheads(0, 0, 0.0)
GPU_1G = GPUSpec("gpu-1g", "1 GiB test GPU", 1 << 30, "test")

DEFAULT_AXES = {
    "train": {C.BATCH: (1,), C.SEQ_LEN: (8,), C.PRECISION: ("fp32",), C.OPTIMIZER: ("adamw",),
              C.OPTIMIZER_IMPL: ("foreach",), C.CHECKPOINTING: ("none",), C.ATTENTION: ("flash",),
              C.CACHE_TOKENS: (0,), C.DECODE_TOKENS: (0,)},
    "infer": {C.BATCH: (1,), C.SEQ_LEN: (8,), C.PRECISION: ("bf16",), C.OPTIMIZER: ("none",),
              C.OPTIMIZER_IMPL: ("none",), C.CHECKPOINTING: ("none",), C.ATTENTION: ("flash",),
              C.CACHE_TOKENS: (0,), C.DECODE_TOKENS: (1,)},
}


def scenario(model: Architecture, mode: str = "train", gpus=(GPU_1G,), overheads=ZERO_OVERHEADS,
             headroom: float = 0.0, **axes) -> Scenario:
    grid = dict(DEFAULT_AXES[mode])
    for k, v in axes.items():
        grid[k] = tuple(v) if isinstance(v, (list, tuple)) else (v,)
    return Scenario(path="", name="test", description="", model=model, mode=mode, grid=grid, gpus=tuple(gpus),
                    overheads=overheads, headroom=headroom)


def params_model(params: int, per_sample: int = 0, per_token: int = 0, name: str = "params") -> Architecture:
    return Architecture(name=name, kind="params", family="params", params=params,
                        activation_elements_per_sample=per_sample, activation_elements_per_token=per_token)


__all__ = ["TINY_LLAMA", "TINY_GPT2", "scenario", "params_model", "replace", "ZERO_OVERHEADS", "GPU_1G"]
