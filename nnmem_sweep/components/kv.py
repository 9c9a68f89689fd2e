"""KV cache of autoregressive inference (Kwon et al. 2023, vLLM §3)."""
from __future__ import annotations

import numpy as np

from ..citations import formula, source
from ..models.arch import Architecture

KWON_2023 = source("kwon2023", "Kwon et al. 2023, Efficient Memory Management for Large Language Model Serving "
                   "with PagedAttention (vLLM)", "arXiv:2309.06180")
HF_CACHE = source("hf-cache", "Hugging Face transformers cache_utils.py: DynamicLayer.update grows keys/values with "
                  "torch.cat; DynamicSlidingWindowLayer keeps the last sliding_window tokens",
                  "https://github.com/huggingface/transformers/blob/main/src/transformers/cache_utils.py")


def cache_tokens(arch: Architecture, tokens: np.ndarray) -> np.ndarray:
    """Tokens a layer's cache holds: capped by the sliding window (Mistral) when the model has one."""
    tokens = np.asarray(tokens, dtype=np.int64)
    if arch.sliding_window:
        return np.minimum(tokens, arch.sliding_window)
    return tokens


def kv_bytes_per_token(arch: Architecture, act_bytes: int) -> int:
    """2 · L · kv_heads · head_dim · bytes: K and V of every layer for one token."""
    return 2 * arch.layers * arch.kv_heads * arch.head_dim * act_bytes


@formula("kv_cache_bytes", "2 · b · T · L · kv_heads · head_dim · bytes,  T = min(tokens, sliding_window)",
         KWON_2023, HF_CACHE, where="§3 (OPT-13B fp16: 800 KB per token)")
def kv_cache_bytes(arch: Architecture, b: np.ndarray, tokens: np.ndarray, act_bytes: int | np.ndarray) -> np.ndarray:
    b = np.asarray(b, dtype=np.int64)
    per_tok = 2 * arch.layers * arch.kv_heads * arch.head_dim * np.asarray(act_bytes, dtype=np.int64)
    return b * cache_tokens(arch, tokens) * per_tok


@formula("kv_cache_append_temporary_bytes", "b · T · kv_heads · head_dim · bytes (one layer's K while torch.cat "
         "builds the grown copy)", HF_CACHE, where="DynamicLayer.update: self.keys = torch.cat([self.keys, k], -2)")
def kv_append_temp_bytes(arch: Architecture, b: np.ndarray, tokens: np.ndarray,
                         act_bytes: int | np.ndarray) -> np.ndarray:
    b = np.asarray(b, dtype=np.int64)
    return b * cache_tokens(arch, tokens) * arch.kv_heads * arch.head_dim * np.asarray(act_bytes, dtype=np.int64)
