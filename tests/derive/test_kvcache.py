"""The KV cache layout of derived causal LMs (derive/kvcache.py), read from the cache their own code fills, against
what each config says the cache must hold (hand-derived below), and the per-sequence formula
(components/kv.kv_bytes_per_sequence) against the bytes the traced cache really held at every probe context."""
import numpy as np
import pytest

from nnmem_sweep.components.kv import CacheLayer, kv_bytes_per_sequence, kv_bytes_per_token_by_window


def _per_seq(layers, c, t=1, block=None):
    by_w = kv_bytes_per_token_by_window(tuple(layers), None, np.array([t]), np.array([0]))
    return int(kv_bytes_per_sequence(by_w, np.array([c]), block)[0])


def test_qwen3_8b_shipped_layout_is_its_config():
    """Qwen3 8B (Hugging Face Qwen/Qwen3-8B config.json: 36 layers, 8 KV heads, head_dim 128), bf16: every layer keeps
    K and V of 8 heads × 128 × 2 B per token: 36 · 2 · 8 · 128 · 2 = 147,456 B per token. Read from the shipped
    layout, no torch needed."""
    from nnmem_sweep import derive
    from nnmem_sweep.models.resolve import resolve_model
    from nnmem_sweep.derive.source import ModelSource

    spec = resolve_model({"preset": "Qwen/Qwen3-8B"}, __import__("pathlib").Path("."))
    with derive.stored_only():
        doc = derive.get_kv_layout(ModelSource.of("hf", spec.spec, spec.origin), "bf16")
    layers = [CacheLayer(*r) for r in doc["layers"]]
    assert layers == [CacheLayer(None, 8, 128, 2, 8, 128, 2)] * 36
    assert _per_seq(layers, 1) == 147_456
    assert _per_seq(layers, 768) == 768 * 147_456 == 113_246_208
    # tensor parallel 2 splits the 8 heads: half per GPU; whole blocks of 16 tokens
    assert _per_seq(layers, 770, t=2, block=16) == 784 * 147_456 // 2


def _shipped(pid):
    from collections import Counter
    from pathlib import Path

    from nnmem_sweep import derive
    from nnmem_sweep.derive.source import ModelSource
    from nnmem_sweep.models.resolve import resolve_model

    spec = resolve_model({"preset": pid}, Path("."))
    with derive.stored_only():
        doc = derive.get_kv_layout(ModelSource.of("hf", spec.spec, spec.origin), "bf16")
    return Counter(CacheLayer(*r) for r in doc["layers"])


def test_deepseek_v3_caches_the_mla_latent():
    """DeepSeek-V2 paper (arXiv:2405.04434) Table 1: MLA caches (d_c + d_h^R)·l elements per token; DeepSeek-V3's
    config: d_c = kv_lora_rank 512, d_h^R = qk_rope_head_dim 64, l = 61 layers: 576 · 61 · 2 B = 70,272 B per token
    in bf16 (a per-head cache of 128 heads × (192 + 128) would be 71× that)."""
    layers = _shipped("deepseek-ai/DeepSeek-V3")
    assert layers == {CacheLayer(None, 1, 512, 2, 1, 64, 2): 61}
    assert _per_seq(list(layers.elements()), 1) == 70_272


def test_gemma_3_27b_local_layers_hold_their_window():
    """Gemma 3 27B's config: 62 layers, every 6th global (sliding_window_pattern 6: 10 global, 52 local with a
    1,024-token window), 16 KV heads of 128. At 32,768 tokens: (52 · 1,024 + 10 · 32,768) · 16 · 128 · 2 · 2 B."""
    layers = _shipped("google/gemma-3-27b-pt")
    assert layers == {CacheLayer(1024, 16, 128, 2, 16, 128, 2): 52, CacheLayer(None, 16, 128, 2, 16, 128, 2): 10}
    assert _per_seq(list(layers.elements()), 32_768) == (52 * 1_024 + 10 * 32_768) * 16 * 128 * 2 * 2


def test_starcoder_caches_one_multi_query_head():
    """StarCoder (GPTBigCode, multi_query: true): one K/V head of 6,144 / 48 = 128 in each of 40 layers."""
    assert _shipped("bigcode/starcoder") == {CacheLayer(None, 1, 128, 2, 1, 128, 2): 40}


torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from nnmem_sweep.derive import kvcache  # noqa: E402
from nnmem_sweep.derive.arch import hf_source  # noqa: E402

GEMMA2 = {"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "hidden_size": 64,
          "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
          "num_hidden_layers": 4, "vocab_size": 1000, "sliding_window": 16, "max_position_embeddings": 4096}
BIGCODE = {"architectures": ["GPTBigCodeForCausalLM"], "model_type": "gpt_bigcode", "n_embd": 64, "n_head": 4,
           "n_layer": 2, "vocab_size": 1000, "n_positions": 2048, "multi_query": True}
DEEPSEEK_V2 = {"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "hidden_size": 64,
               "intermediate_size": 128, "moe_intermediate_size": 32, "num_attention_heads": 4,
               "num_key_value_heads": 4, "num_hidden_layers": 2, "vocab_size": 1000, "kv_lora_rank": 32,
               "q_lora_rank": None, "qk_rope_head_dim": 16, "qk_nope_head_dim": 16, "v_head_dim": 16,
               "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1, "first_k_dense_replace": 1,
               "max_position_embeddings": 2048}

SLIDING, GLOBAL = CacheLayer(16, 2, 16, 2, 2, 16, 2), CacheLayer(None, 2, 16, 2, 2, 16, 2)
CASES = {
    # Gemma 2 alternates local (sliding window, even layers) and global attention; 2 KV heads of head_dim 16
    "gemma2-sliding": (GEMMA2, [SLIDING, GLOBAL, SLIDING, GLOBAL]),
    # multi_query: one K/V head of n_embd / n_head = 16 whatever the head count
    "gpt_bigcode-multi-query": (BIGCODE, [CacheLayer(None, 1, 16, 2, 1, 16, 2)] * 2),
    # MLA: the compressed latent (kv_lora_rank 32) and the decoupled rope key (qk_rope_head_dim 16), one "head" each,
    # not 4 heads of nope+rope keys and v_head_dim values
    "deepseek_v2-mla-latent": (DEEPSEEK_V2, [CacheLayer(None, 1, 32, 2, 1, 16, 2)] * 2),
}


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NNMEM_SWEEP_CACHE", str(tmp_path / "cache"))


@pytest.mark.parametrize("name", sorted(CASES))
def test_layout_read_from_the_models_cache(name):
    cfg, want = CASES[name]
    doc = kvcache.measure(hf_source(cfg, name), "bf16")
    layers = [CacheLayer(*r) for r in doc["layers"]]
    assert layers == want
    # the formula gives what the cache really held at every probe (both sides of a window included)
    assert len(doc["probes"]) >= 2
    for c, held in doc["probes"]:
        assert _per_seq(layers, c) == held, c


def test_sliding_layers_stop_at_their_window():
    """Gemma 2 tiny, by hand: 128 B per token per layer (K and V, 2 heads × 16 × 2 B); at 40 tokens the two sliding
    layers hold 16, the two global ones 40: (2·16 + 2·40) · 128 = 14,336 B; a block of 16 pads each to whole blocks
    (16 and 48)."""
    layers = [SLIDING, GLOBAL, SLIDING, GLOBAL]
    assert _per_seq(layers, 40) == 14_336
    assert _per_seq(layers, 40, block=16) == (2 * 16 + 2 * 48) * 128


def test_a_single_head_is_replicated_under_tensor_parallel():
    """vLLM keeps a multi-query head (and MLA's latent) whole on every rank: tp 4 does not divide it."""
    mqa = [CacheLayer(None, 1, 16, 2, 1, 16, 2)] * 2
    assert _per_seq(mqa, 100, t=4) == _per_seq(mqa, 100, t=1) == 100 * 2 * 2 * 16 * 2
