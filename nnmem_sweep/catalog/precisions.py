"""Precision recipes as data: what each recipe stores, in bytes per element (FORMULAS.md, "Precision recipes").

A recipe says how many bytes the model's weights, gradients, fp32 master copy and optimizer state take per
parameter, what dtype matmul outputs (the bulk of saved activations) and the residual stream have, and whether
autocast keeps 16-bit copies of the matmul weights alive during forward. Quantised recipes (int8, int4, nf4) store
only the linear weights inside the transformer blocks in `quant_bits` bits plus block scales
(components/weights.py); embeddings, norms and the LM head stay 16-bit.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..citations import formula, source
from ..errors import UsageError
from .names import PRECISIONS as PRECISION_NAMES

ZERO_2019 = source("rajbhandari2019", "Rajbhandari et al. 2019, ZeRO: Memory Optimizations Toward Training "
                   "Trillion Parameter Models", "arXiv:1910.02054")
TORCH_AMP = source("torch-amp", "PyTorch documentation, Automatic Mixed Precision package - torch.amp "
                   "(autocast op lists and weight-cast cache)", "https://pytorch.org/docs/stable/amp.html")
DETTMERS_2022 = source("dettmers2022", "Dettmers et al. 2022, LLM.int8(): 8-bit Matrix Multiplication for "
                       "Transformers at Scale", "arXiv:2208.07339")
DETTMERS_2023 = source("dettmers2023", "Dettmers et al. 2023, QLoRA: Efficient Finetuning of Quantized LLMs",
                       "arXiv:2305.14314")
# bitsandbytes 0.50 backends/cuda/ops.py (_gemm_4bit_custom_max_m): past this many rows (b·s) a 4-bit matmul on CUDA
# dequantizes the whole weight and calls F.linear; at or below it a fused kernel may run instead (QLoRA's trace,
# workload/qlora.py, takes the dequantizing path)
BNB_CUDA_DEQUANT_ROWS = 1536
MICIKEVICIUS_2022 = source("micikevicius2022", "Micikevicius et al. 2022, FP8 Formats for Deep Learning",
                           "arXiv:2209.05433")
VLLM_FP8 = source("vllm-fp8", "vLLM documentation, FP8 W8A8 quantization (e4m3 weights; per-tensor or per-channel "
                  "fp32 weight scales; lm_head and embeddings unquantised)",
                  "https://docs.vllm.ai/en/latest/features/quantization/fp8.html")
FRANTAR_2022 = source("frantar2022", "Frantar et al. 2022, GPTQ: Accurate Post-Training Quantization for "
                      "Generative Pre-trained Transformers", "arXiv:2210.17323")


@dataclass(frozen=True)
class Precision:
    name: str
    weight_bytes: int  # bytes per parameter of the model's own weights (non-quantised tensors)
    grad_bytes: int  # bytes per parameter of .grad (0: inference-only recipe)
    master_bytes: int  # fp32 master copy kept beside 16-bit weights (bf16-master), else 0
    state_bytes: int  # dtype of torch.optim state tensors (they follow the dtype of the parameter they update)
    act_bytes: int  # matmul outputs / saved activations, the KV cache
    residual_bytes: int  # residual stream and norm inputs (fp32 under autocast: params and embeddings are fp32)
    autocast: bool  # autocast caches a 16-bit copy of each matmul weight during forward (saved for backward)
    quant_bits: int = 0  # bits per quantised linear weight (0: not quantised)
    quant: str = ""  # "" | "int8" | "int4" | "nf4": which block-scale layout (components/weights.py)
    infer_only: bool = False
    stores: str = ""  # one line for the report


PRECISIONS: dict[str, Precision] = {p.name: p for p in (
    Precision("fp32", 4, 4, 0, 4, 4, 4, False, stores="fp32 weights, grads, optimizer state and activations"),
    Precision("bf16", 2, 2, 0, 2, 2, 2, False, stores="model cast to bf16: weights, grads, state, activations"),
    Precision("fp16", 2, 2, 0, 2, 2, 2, False, stores="model cast to fp16: weights, grads, state, activations"),
    Precision("bf16-mixed", 4, 4, 0, 4, 2, 4, True,
              stores="torch.autocast(bf16): fp32 params/grads/state, bf16 matmul outputs, cached bf16 weight copies"),
    Precision("fp16-mixed", 4, 4, 0, 4, 2, 4, True,
              stores="torch.autocast(fp16): fp32 params/grads/state, fp16 matmul outputs, cached fp16 weight copies"),
    # ZeRO §3: 2Ψ (16-bit weights) + 2Ψ (16-bit grads) + 12Ψ (fp32 master, momentum, variance) = 16Ψ with Adam.
    Precision("bf16-master", 2, 2, 4, 4, 2, 2, False,
              stores="bf16 weights and grads, fp32 master copy and fp32 optimizer state (ZeRO / Megatron style)"),
    # LLM.int8(): int8 weights with one fp32 absmax scale per output row (bitsandbytes Int8Params.SCB).
    Precision("int8", 2, 0, 0, 0, 2, 2, False, quant_bits=8, quant="int8", infer_only=True,
              stores="block linear weights int8 + fp32 per-row scale; the rest 16-bit"),
    # GPTQ/AWQ-style: 4-bit weights, per group of 128 input columns an fp16 scale and a packed 4-bit zero point.
    Precision("int4", 2, 0, 0, 0, 2, 2, False, quant_bits=4, quant="int4", infer_only=True,
              stores="block linear weights int4, group 128: fp16 scale + 4-bit zero per group; the rest 16-bit"),
    # QLoRA §3: NF4 blocks of 64 with double-quantised absmax (8-bit, second-level fp32 per 256 blocks).
    Precision("nf4", 2, 0, 0, 0, 2, 2, False, quant_bits=4, quant="nf4", infer_only=True,
              stores="block linear weights NF4, blocksize 64, double-quantised absmax; the rest 16-bit"),
    # FP8 e4m3 (Micikevicius 2022 §3) as vLLM stores it: block linears 1 B/weight with one fp32 scale per output
    # channel -- the same bytes as the int8 per-row layout, so it reuses it (see fp8_weight_bytes below).
    Precision("fp8", 2, 0, 0, 0, 2, 2, False, quant_bits=8, quant="int8", infer_only=True,
              stores="block linear weights fp8 e4m3 + fp32 per-channel scale; the rest 16-bit"),
)}

assert tuple(PRECISIONS) == PRECISION_NAMES, "catalog/names.py and precisions.py must list the same recipes"


@formula("quantized_weight_bytes.fp8", "n·1 + rows·4  (e4m3 values, fp32 scale per output channel)",
         MICIKEVICIUS_2022, VLLM_FP8, where="§3 (E4M3 for weights and activations); vLLM Fp8LinearMethod weight_scale",
         note="Per-channel scales, as vLLM's dynamic fp8 and compressed-tensors channel checkpoints store them. A "
              "per-tensor checkpoint keeps one fp32 weight_scale and one input_scale per linear instead: n·1 + 8, "
              "at most rows·4 − 8 bytes less per matrix (0.4 % of a 4096-wide matrix); the estimate keeps the larger.")
def fp8_weight_bytes(rows: int, cols: int) -> int:
    return rows * cols + rows * 4


def get_precision(name: str) -> Precision:
    try:
        return PRECISIONS[name]
    except (KeyError, TypeError):
        raise UsageError(f"unknown precision {name!r}; known: {', '.join(PRECISIONS)}") from None
