"""The estimator against measured PyTorch peaks (torch.cuda.max_memory_allocated's equivalent), pinned.

Measured with MemTracker under FakeTensorMode (torch 2.13, transformers 5.23; tests/data/truth/<case>.json,
nnmem_sweep/measure): two training steps (peak over both) or a generate()-style prefill + decode. Tolerance 0.01 %:
the remaining bytes are buffers, the optimizer's host-side step scalars and the like. GPT-2 runs eager attention
with dropout routed to native_dropout (the 1-byte masks CUDA keeps).
"""
import pandas as pd
import pytest

from nnmem_sweep import columns as C
from nnmem_sweep.peak import estimate_components
from nnmem_sweep.models.presets import load_preset

CASES = [
    # case id (tests/data/truth), preset, mode, batch, seq, precision, optimizer, impl, ckpt, attention, decode, bytes
    ("llama-3.2-1b-train-bf16-adamw-b1-s2048", "llama-3.2-1b", "train", 1, 2048, "bf16", "adamw", "foreach",
     "none", "flash", 0, 14_162_252_624),
    ("llama-3.2-1b-train-bf16-adamw-ckptfull-b8-s2048", "llama-3.2-1b", "train", 8, 2048, "bf16", "adamw",
     "foreach", "full", "flash", 0, 33_974_088_528),
    ("llama-3.2-1b-train-bf16-adamw-eager-b2-s512", "llama-3.2-1b", "train", 2, 512, "bf16", "adamw", "foreach",
     "none", "eager", 0, 12_497_617_744),
    ("llama-3.1-8b-train-bf16-mixed-adamw-b1-s1024", "llama-3.1-8b", "train", 1, 1024, "bf16-mixed", "adamw",
     "foreach", "none", "flash", 0, 160_605_243_020),
    ("qwen2.5-0.5b-train-fp32-adam-b2-s512", "qwen2.5-0.5b", "train", 2, 512, "fp32", "adam", "foreach", "none",
     "flash", 0, 10_450_661_264),
    ("llama-3.2-1b-train-bf16-adafactor-b4-s1024", "llama-3.2-1b", "train", 4, 1024, "bf16", "adafactor",
     "foreach", "none", "flash", 0, 15_967_378_768),
    ("gpt2-train-fp32-adamw-eager-nativedropout-b4-s512", "gpt2", "train", 4, 512, "fp32", "adamw", "foreach",
     "none", "eager", 0, 6_253_629_016),
    ("llama-3.2-1b-infer-bf16-b16-s512-d16", "llama-3.2-1b", "infer", 16, 512, "bf16", "none", "none", "none",
     "flash", 16, 3_277_136_128),
    ("llama-3.1-8b-infer-bf16-b8-s4096-d16", "llama-3.1-8b", "infer", 8, 4096, "bf16", "none", "none", "none",
     "flash", 16, 24_250_196_480),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_peak_matches_measured(case):
    _, preset, mode, b, s, prec, opt, impl, ckpt, attn, dec, measured = case
    frame = pd.DataFrame({C.BATCH: [b], C.SEQ_LEN: [s], C.PRECISION: [prec], C.OPTIMIZER: [opt],
                          C.OPTIMIZER_IMPL: [impl], C.CHECKPOINTING: [ckpt], C.ATTENTION: [attn],
                          C.CACHE_TOKENS: [0], C.DECODE_TOKENS: [dec]})
    est = int(estimate_components(load_preset(preset), mode, frame)[C.PEAK_ALLOCATED][0])
    assert abs(est - measured) <= measured * 1e-4, f"estimated {est:,} vs measured {measured:,}"
