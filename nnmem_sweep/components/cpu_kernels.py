"""CPU-only attention kernel: the math fallback of scaled_dot_product_attention (device="cpu" only).

The estimator models CUDA by default. On the CPU, SDPA's flash kernel refuses dropout_p > 0, so a training run of a
model with attention dropout (GPT-2, BERT: 0.1) asked for "flash" (sdpa) runs ATen's composite
`_scaled_dot_product_attention_math` instead (MEASURING.md; the truth cases log `_safe_softmax`, the math path's
softmax). On a GPU the flash / memory-efficient kernels take dropout without any s×s tensor, so none of this applies
there. Only `activations.attention_saved` calls this module, and only for device="cpu".

What the math path keeps for backward, read from aten/src/ATen/native/transformers/attention.cpp
(`_scaled_dot_product_attention_math`, CompositeImplicitAutograd, so autograd sees each op):

    q_acc, k_acc, v_acc = q, k, v upcast to fp32 when they are fp16/bf16 ("keep query, key, value in high precision
                          for accuracy"; allowFP16BF16ReductionMathSDP is off by default); `.to()` saves nothing
    q' = q_acc · √scale,  k' = k_acc.transpose · √scale      saved by the first matmul     4·(hq + hkv) per token
    attn = _safe_softmax(q' @ k' (+ mask))                   softmax saves its output        acc per s² element, head
    attn = dropout(attn)   CPU composite: attn · noise, the noise in attn's dtype (Dropout.cpp, the fused
                           native_dropout is CUDA/XPU only)  the mul saves the noise          acc per s² element, head
    out = (attn @ v_acc).to(origin dtype)                    the matmul saves attn and v_acc acc + 4·hkv
    o_proj input = out.transpose(1, 2).contiguous()          e·hq per token (as eager)

so, with acc = 4 for 16-bit inputs (else e): per token acc·(hq + 2·hkv) + e·hq, per s² element 3·acc per head.
The bf16 q, k, v themselves are not kept (only their fp32 upcasts are). For fp32 models this equals eager attention
with CPU dropout; for bf16 it is where the measured bf16 GPT-2 / BERT cases keep twice the s² bytes of eager bf16.
Checked against the committed truth: gpt2-medium bf16 b2 s1024, bert-large bf16 b16 s128, gpt2 and bert-base
bf16-mixed (tests/components/test_cpu_kernels.py, tests/test_accuracy.py).
"""
from __future__ import annotations

from ..catalog.precisions import Precision
from ..citations import formula, source
from ..models.arch import Architecture
from .terms import Term

TORCH_SDPA_MATH = source(
    "torch-sdpa-math", "PyTorch aten/src/ATen/native/transformers/attention.cpp, _scaled_dot_product_attention_math "
    "(the composite fallback; the CPU flash kernel refuses dropout_p > 0) and Dropout.cpp (CPU dropout multiplies by "
    "a noise tensor of the input's dtype)",
    "https://github.com/pytorch/pytorch/blob/main/aten/src/ATen/native/transformers/attention.cpp")

FP32 = 4  # the math path computes in fp32 for fp16/bf16 inputs (q, k, v `.to(at::kFloat)`)


def sdpa_falls_back_to_math(arch: Architecture, attention: str, device: str) -> bool:
    """True where a CPU run asked for SDPA ("flash") gets the math path: attention dropout > 0 (training)."""
    return device == "cpu" and attention == "flash" and arch.attn_dropout > 0


def math_accumulate_bytes(act_bytes: int) -> int:
    """Bytes per element the math path computes in: fp32 for 16-bit (and 8-bit) inputs, else the input's own."""
    return max(act_bytes, FP32)


@formula("cpu_math_sdpa_saved_bytes",
         "acc·(hq + 2·hkv) + e·hq per token; 3·acc·a per s² element (softmax output, dropout noise, dropped "
         "probabilities); acc = 4 for 16-bit inputs", TORCH_SDPA_MATH,
         where="_scaled_dot_product_attention_math; dropout / _dropout_impl",
         note="device='cpu' only, with attention dropout > 0: the kernel a CPU run falls back to. A GPU keeps no s×s "
         "tensor with flash attention.")
def math_sdpa_saved(arch: Architecture, p: Precision, drop_scores: bool = False) -> Term:
    """What the math SDPA fallback keeps from Q/K/V to the o_proj input, per token and per s² element."""
    e, a = p.act_bytes, arch.heads
    hq, hkv = arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim
    acc = math_accumulate_bytes(e)
    kv_width = hq if hkv != hq else hkv  # GQA: K and V expanded to the query heads before the matmuls
    tok = acc * (hq + 2 * kv_width)  # scaled q, scaled (transposed) k, v_acc: saved by the two matmuls
    tok += e * hq  # output cast back to the input dtype, made contiguous as (b, s, a·d): the o_proj input
    # softmax output (saved by _safe_softmax backward), the CPU dropout noise (same dtype as the probabilities, saved
    # by the mul) and the dropped probabilities (saved by the P·V matmul): all in the accumulate dtype
    s2 = 0 if drop_scores else a * 3 * acc
    return Term(tok=tok, s2=s2)
