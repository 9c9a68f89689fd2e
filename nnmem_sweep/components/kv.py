"""KV cache of autoregressive inference (Kwon et al. 2023, vLLM §3)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..catalog.precisions import get_precision
from ..citations import formula, source
from ..errors import UsageError
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


# ---------------------------------------------------------------- serving plans (nnmem_sweep/serving.py)

VLLM_KV_FP8 = source("vllm-kv-fp8", "vLLM documentation, Quantized KV Cache (kv_cache_dtype fp8 = fp8_e4m3: 1 byte "
                     "per element, one k_scale and v_scale per layer)",
                     "https://docs.vllm.ai/en/latest/features/quantization/quantized_kvcache.html")
LMDEPLOY_KV_INT8 = source("lmdeploy-kv-int8", "LMDeploy documentation, INT4/INT8 KV Cache (quant_policy=8: per-head "
                          "per-token asymmetric int8, an fp16 scale and zero point per head and token)",
                          "https://lmdeploy.readthedocs.io/en/latest/quantization/kv_quant.html")
VLLM_ENGINE_ARGS = source("vllm-engine-args", "vLLM documentation, engine arguments (block_size default 16, "
                          "gpu_memory_utilization default 0.9, max_num_batched_tokens, tensor_parallel_size)",
                          "https://docs.vllm.ai/en/latest/configuration/engine_args.html")

# Bytes per cached element and per-(head, token) scale bytes for each KV dtype; "auto" takes the recipe's act_bytes.
KV_ELEMENT_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1, "int8": 1}
KV_SCALE_BYTES_PER_HEAD_TOKEN = {"bf16": 0, "fp16": 0, "fp8": 0, "int8": 4}  # int8: fp16 scale + fp16 zero point


def kv_heads_per_gpu(arch: Architecture, t: np.ndarray | int) -> np.ndarray:
    """KV heads one tensor-parallel rank holds: kv_heads / t, and 1 (replicated) when t > kv_heads (MQA/GQA)."""
    return np.maximum(1, arch.kv_heads // np.asarray(t, dtype=np.int64))


@formula("kv_bytes_per_token_per_gpu",
         "2 · L · ⌈kv_heads / t⌉ · (head_dim · bytes(kv_dtype) + scale bytes per head and token)",
         KWON_2023, VLLM_KV_FP8, LMDEPLOY_KV_INT8,
         where="§3 (2 · L · h · bytes per token: OPT-13B fp16 800 KiB); tensor parallel shards the KV heads",
         note="fp8 keeps 2 fp32 scales per layer, not per token (2·L·4 B in all; left out). int8 adds 4 B per head "
              "and token for K and for V (fp16 scale + zero point). With t > kv_heads each rank keeps a replica "
              "of a head, as vLLM does.")
def kv_bytes_per_token_per_gpu(arch: Architecture, element_bytes: np.ndarray | int, t: np.ndarray | int = 1,
                               scale_bytes: np.ndarray | int = 0) -> np.ndarray:
    per_head = arch.head_dim * np.asarray(element_bytes, dtype=np.int64) + np.asarray(scale_bytes, dtype=np.int64)
    return 2 * arch.layers * kv_heads_per_gpu(arch, t) * per_head


@formula("kv_cached_tokens_paged", "⌈min(T, sliding_window) / block⌉ · block", KWON_2023, VLLM_ENGINE_ARGS,
         where="§4.2 (KV blocks of a fixed number of tokens; a sequence takes whole blocks); block_size default 16",
         note="Without kv_block_size the cache holds exactly min(T, sliding_window) tokens (a contiguous cache).")
def paged_tokens(arch: Architecture, tokens: np.ndarray, block_size: int | None) -> np.ndarray:
    held = cache_tokens(arch, tokens)
    if not block_size:
        return held
    return -(-held // block_size) * block_size


# ---------------------------------------------------------------- what each layer's cache holds (serving plans)

@dataclass(frozen=True)
class CacheLayer:
    """One layer of a KV cache: the tokens it holds (every one, or at most `window`), and its keys' and values'
    heads, width (elements per head and token) and element bytes as cached."""

    window: int | None
    k_heads: int
    k_width: int
    k_bytes: int
    v_heads: int
    v_width: int
    v_bytes: int


def cache_layers(arch: Architecture, precision: str) -> tuple[CacheLayer, ...]:
    """The layers of a model's cache: a hand-modelled transformer's from its config (L layers of kv_heads heads of
    head_dim, in the recipe's activation dtype, each capped at the sliding window where the model has one); a
    derived causal LM's read from the cache its own code fills (derive/kvcache.py: MLA's latent, sliding layers,
    one multi-query head)."""
    if arch.kind == "derived":
        from .. import derive

        try:
            doc = derive.get_kv_layout(arch.derived.source, precision, progress=True)
        except derive.DerivationError as e:
            raise UsageError(f"{arch.name}: {e}") from None
        return tuple(CacheLayer(*row) for row in doc["layers"])
    e = get_precision(precision).act_bytes
    one = CacheLayer(arch.sliding_window or None, arch.kv_heads, arch.head_dim, e, arch.kv_heads, arch.head_dim, e)
    return (one,) * arch.layers


def _heads_per_gpu(heads: int, t: np.ndarray) -> np.ndarray:
    return np.maximum(1, heads // t)


@formula("kv_bytes_per_token_per_gpu.by_window",
         "β_W = Σ_{layers l of window W} ⌈h_l / t⌉_1 · (d_l · bytes(kv_dtype) + scale)  for K and for V",
         KWON_2023, VLLM_KV_FP8, LMDEPLOY_KV_INT8, HF_CACHE,
         where="the heads h_l and widths d_l as the model's cache holds them (derived models: read from it)",
         note="⌈h/t⌉_1 = max(1, h // t): tensor parallel splits a layer's heads, and a rank keeps one (a replica) "
              "where t exceeds them: one multi-query head, or MLA's latent (one 'head' for K, one for V), is "
              "replicated on every rank, as vLLM does. kv_dtype auto keeps the cached element bytes.")
def kv_bytes_per_token_by_window(layers: tuple[CacheLayer, ...], element_bytes: np.ndarray | None, t: np.ndarray,
                                 scale_bytes: np.ndarray) -> dict[int | None, np.ndarray]:
    """Bytes per token per GPU of the layers of each window (None: every token), per row of element_bytes (None:
    each layer's own, kv_dtype auto), t and scale_bytes."""
    t = np.asarray(t, dtype=np.int64)
    scale = np.asarray(scale_bytes, dtype=np.int64)
    out: dict[int | None, np.ndarray] = {}
    for x in layers:
        ek = x.k_bytes if element_bytes is None else np.asarray(element_bytes, dtype=np.int64)
        ev = x.v_bytes if element_bytes is None else np.asarray(element_bytes, dtype=np.int64)
        b = _heads_per_gpu(x.k_heads, t) * (x.k_width * ek + scale) + _heads_per_gpu(x.v_heads, t) * (
            x.v_width * ev + scale)
        out[x.window] = out.get(x.window, 0) + b
    return out


@formula("kv_bytes_per_sequence", "per_seq(c) = Σ_W β_W · ⌈min(c, W) / block⌉ · block", KWON_2023,
         VLLM_ENGINE_ARGS, HF_CACHE,
         where="§4.2 (a sequence takes whole blocks, per layer); a sliding-window layer holds at most its window "
               "(DynamicSlidingWindowLayer; W = ∞ for the other layers)",
         note="Not linear in c when sliding and global layers mix (Gemma 2/3): max_context inverts it by "
              "bisection.")
def kv_bytes_per_sequence(per_window: dict[int | None, np.ndarray], c: np.ndarray, block: int | None) -> np.ndarray:
    c = np.asarray(c, dtype=np.int64)
    total = np.zeros(np.broadcast(c, *per_window.values()).shape, dtype=np.int64)
    for window, beta in per_window.items():
        held = c if window is None else np.minimum(c, window)
        if block:
            held = -(-held // block) * block
        total = total + beta * held
    return total
