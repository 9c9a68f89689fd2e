"""The utilisations the throughput estimate assumes when the scenario states none, each with where it comes from.

Rule for a published default: the median of the cited figures for that GPU generation and precision, rounded to
the nearest 5 %. A generation with no published figure takes the default of a generation that has one, and says
so ("extrapolated", with the generation it was taken from); nothing here was fitted to the figures the tests
reproduce. Every `Assumption` carries its sources so the report can print it beside the figure it produced.

Training MFU (model FLOPs utilisation) is against the dense tensor peak of the compute dtype (`compute_dtype`);
fp8 against the fp8 peak, as MosaicML's fp8 table computes it. The published figures are for runs without full
recomputation (none or selective); with full recomputation the GPU is assumed to sustain the same hardware FLOP
rate and to spend part of it recomputing, so MFU = default × model FLOPs / hardware FLOPs (3/4 when the output
head is ignored). Korthikanti et al. 2022 measured both on one model: 54.2 % MFU with selective recomputation,
42.1 % with full recomputation; the rule predicts 40.7 %.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..catalog.precisions import get_precision
from ..citations import Source, formula, source
from ..components.activations import KORTHIKANTI_2022

LLAMA3_2024 = source("llama3-2024", "Llama Team, AI @ Meta 2024, The Llama 3 Herd of Models (Table 4: 405B "
                     "pre-training on 8,192 / 16,384 / 16,384 H100 at 430 / 400 / 380 TFLOP/s per GPU, BF16 MFU "
                     "43 / 41 / 38 %)", "arXiv:2407.21783")
TORCHTITAN_A100 = source("torchtitan-perf-a100", "torchtitan docs/performance.md: Llama 3 8B on 64 A100 80GB with "
                         "FSDP2, local batch 1, seq 8192: 2,904 / 2,973 tokens/s per GPU, MFU 56.8 / 58.2 % (selective "
                         "layer / op activation checkpointing); 70B full AC 331 tokens/s, 51.7 %",
                         "https://github.com/pytorch/torchtitan/blob/main/docs/performance.md")
TORCHTITAN_H100 = source("torchtitan-perf-h100", "torchtitan benchmarks/llama3_h100_202412_torchtitan.md: Llama 3.1 "
                         "8B on 8 H100 (96 GB HBM2e, 500 W), FSDP, local batch 2, seq 8192, selective AC: 5,762 "
                         "tokens/s per GPU eager, 6,667 with torch.compile, 8,532 with Float8 ('33 % to 39 % MFU')",
                         "https://github.com/pytorch/torchtitan/blob/main/benchmarks/llama3_h100_202412_torchtitan.md")
LLM_FOUNDRY = source("llm-foundry-bench", "MosaicML llm-foundry scripts/train/benchmarking/README.md: MPT training "
                     "throughput, MFU and HFU on A100 and H100 (bf16 and fp8; HFU = 4/3 MFU with activation "
                     "checkpointing)",
                     "https://github.com/mosaicml/llm-foundry/blob/main/scripts/train/benchmarking/README.md")
SHOEYBI_2019 = source("shoeybi2019-throughput", "Shoeybi et al. 2019, Megatron-LM (abstract: 8.3B parameters on 512 "
                      "V100 sustain 15.1 PFLOP/s, 76 % scaling efficiency against 39 TFLOP/s, 30 % of peak, on one "
                      "GPU)", "arXiv:1909.08053")
GPT_FAST = source("gpt-fast", "pytorch-labs/gpt-fast README, Benchmarks: batch 1 on A100-80GB (power-limited to "
                  "330 W): Llama-2-7B bf16 104.9 tokens/s at 1,397.31 GB/s, int8 155.58 at 1,069.20, int4 196.80 at "
                  "862.69; Llama-2-70B int8 19.13 at 1,322.58, int4 25.25 at 1,097.66",
                  "https://github.com/pytorch-labs/gpt-fast/blob/main/README.md")
NIM_BENCH = source("nim-llm-benchmarks", "NVIDIA NIM LLMs Benchmarking 1.0.0, Performance: Llama-3.3-70b-instruct "
                   "NIM 1.8.0 on 2 x H100 80G, fp8, TP2: 5,000 input / 500 output tokens, concurrency 1: TTFT "
                   "406.77 ms, ITL 18.58 ms; 500 input / 2,000 output: TTFT 47.77 ms, ITL 18.91 ms",
                   "https://docs.nvidia.com/nim/benchmarking/llm/1.0.0/performance.html")
TORCH_TF32 = source("torch-tf32", "PyTorch CUDA semantics, TensorFloat-32 on Ampere and later: "
                    "torch.backends.cuda.matmul.allow_tf32 is False by default since 1.12 "
                    "(torch.set_float32_matmul_precision('highest'))",
                    "https://pytorch.org/docs/stable/notes/cuda.html#tensorfloat-32-tf32-on-ampere-and-later-devices")

GENERATIONS = ("volta", "turing", "ampere", "ada", "hopper", "blackwell", "cdna2", "cdna3", "cdna4")
FP8_GENERATIONS = ("ada", "hopper", "blackwell", "cdna3", "cdna4")  # fp8 tensor cores (the others have no fp8 peak)


@dataclass(frozen=True)
class Assumption:
    """One assumed figure and why: what the report prints beside an estimate."""

    name: str  # e.g. "training MFU"
    value: float
    basis: str  # "published" | "extrapolated" | "stated" (given by the scenario)
    sources: tuple[Source, ...]
    note: str  # how the value follows from the sources

    def label(self) -> str:
        """'40 % training MFU (published: Llama 3 Table 4 ...)'-style text for a report line."""
        keys = ", ".join(s.key for s in self.sources)
        return f"{self.value:.0%} {self.name} ({self.basis}{': ' + keys if keys else ''})"


def stated(name: str, value: float, where: str = "scenario") -> Assumption:
    """A figure the user gave: printed as theirs."""
    return Assumption(name, float(value), "stated", (), f"given in the {where}")


@formula("throughput.compute_dtype", "fp32 → fp32; bf16* → bf16; fp16* → fp16; int8/int4/nf4 → bf16; fp8 → fp8",
         TORCH_TF32, where="allow_tf32 = False by default; weight-only formats dequantise to the activation dtype",
         note="Which dense tensor peak an estimate divides by.")
def compute_dtype(precision: str) -> str:
    """The dtype whose peak FLOP/s a recipe's matmuls run at (a key of GPUSpec.peak_flops)."""
    if precision == "fp32":
        return "fp32"  # PyTorch keeps fp32 matmuls in fp32 unless the user enables tf32
    if precision == "fp8":
        return "fp8"  # W8A8: fp8 GEMMs where the GPU has fp8 tensor cores
    if precision.startswith("fp16"):
        return "fp16"
    get_precision(precision)  # raises on an unknown name
    return "bf16"


# (generation, class) -> (value, sources, how). class: "16bit" (bf16/fp16 peak) or "fp8" (fp8 peak).
_TRAINING: dict[tuple[str, str], tuple[float, tuple[Source, ...], str]] = {
    ("ampere", "16bit"): (0.55, (TORCHTITAN_A100, KORTHIKANTI_2022),
                          "median of 56.8 and 58.2 % (torchtitan, Llama 3 8B, 64 A100, selective AC) and 54.2 % "
                          "(Korthikanti et al., 530B on 2,240 A100, selective recomputation), to the nearest 5 %"),
    ("hopper", "16bit"): (0.40, (LLAMA3_2024, TORCHTITAN_H100),
                          "median of 43, 41 and 38 % (Llama 3 405B on 8,192-16,384 H100, Table 4) and 33 and 39 % "
                          "(torchtitan, Llama 3.1 8B, 8 H100 at 500 W, eager / compiled), to the nearest 5 %"),
    ("volta", "16bit"): (0.25, (SHOEYBI_2019,),
                         "15.1 PFLOP/s / 512 V100 = 29.5 TFLOP/s = 23.6 % of the 125 TFLOP/s fp16 peak, to the "
                         "nearest 5 %; the abstract does not say whether recomputation is counted"),
    ("hopper", "fp8"): (0.25, (TORCHTITAN_H100, LLM_FOUNDRY),
                        "of the fp8 peak: median of 25.0 % (torchtitan Float8, Llama 3.1 8B, 8,532 tokens/s on 8 "
                        "H100) and 20.7-30.3 % (MosaicML MPT 1B/3B fp8, seq 512-8192, no checkpointing), to the "
                        "nearest 5 %"),
}
# Where nothing is published: Hopper's figure (the latest generation with large-scale published runs; the lower of
# the two current-software 16-bit defaults, so the estimate errs towards more GPUs).
_FALLBACK = {"16bit": "hopper", "fp8": "hopper"}


def _precision_class(precision: str) -> str:
    dtype = compute_dtype(precision)
    return "fp8" if dtype == "fp8" else "16bit"


def _lookup(generation: str | None, cls: str) -> tuple[float, tuple[Source, ...], str, str]:
    key = (generation or "", cls)
    if key in _TRAINING:
        value, sources, how = _TRAINING[key]
        return value, sources, how, "published"
    donor = _FALLBACK[cls]
    value, sources, how = _TRAINING[(donor, cls)]
    what = generation or "this GPU"
    return value, sources, f"no published MFU for {what}: {donor}'s default ({how})", "extrapolated"


@formula("throughput.training_mfu_default",
         "ampere 0.55, hopper 0.40, volta 0.25 (16-bit); hopper 0.25 (fp8, of the fp8 peak); others: hopper's; "
         "full recomputation: × model FLOPs / hardware FLOPs",
         LLAMA3_2024, TORCHTITAN_A100, TORCHTITAN_H100, KORTHIKANTI_2022, SHOEYBI_2019, LLM_FOUNDRY,
         where="Llama 3 Table 4; torchtitan performance tables; Korthikanti et al. abstract and §5",
         note="Median of the cited figures per generation, nearest 5 %. fp32 recipes: the 16-bit figure applied to "
              "the fp32 peak (extrapolated).")
def training_mfu(generation: str | None, precision: str = "bf16", recompute: str = "none",
                 recompute_ratio: float | None = None) -> Assumption:
    """Default training MFU for a GPU generation (GPUSpec.architecture), a precision recipe and a recomputation
    mode. recompute_ratio: hardware / model FLOPs of the model (flops.recompute_ratio); 4/3 when not given."""
    cls = _precision_class(precision)
    value, sources, how, basis = _lookup(generation, cls)
    if compute_dtype(precision) == "fp32":
        basis, how = "extrapolated", f"fp32 recipe: the 16-bit figure applied to the fp32 peak ({how})"
    if recompute == "full":
        ratio = 4 / 3 if recompute_ratio is None else float(recompute_ratio)
        value = value / ratio
        how += (f"; × {1 / ratio:.3f} (model / hardware FLOPs) for full recomputation, the GPU assumed to sustain "
                "the same hardware FLOP rate")
        sources = sources + (KORTHIKANTI_2022,) if KORTHIKANTI_2022 not in sources else sources
    elif recompute not in ("none", "selective"):
        raise ValueError(f"recompute {recompute!r}: expected none, selective or full")
    return Assumption("training MFU", value, basis, sources, how)


@formula("throughput.decode_bandwidth_efficiency_default", "8- and 16-bit weights 0.65; 4-bit weights 0.50",
         GPT_FAST, where="README, Benchmarks (batch 1, A100-80GB at 330 W, nominal 2,039 GB/s)",
         note="Achieved / datasheet bandwidth: 1,397.31 (bf16) and 1,322.58 GB/s (int8 70B) → 68.5 and 64.9 %, "
              "median 66.7 % → 0.65; int4 862.69 and 1,097.66 GB/s → 42.3 and 53.8 % → 0.50. Other generations: "
              "the A100 figure (extrapolated).")
def decode_bandwidth_efficiency(generation: str | None, weight_bits: int = 16) -> Assumption:
    """Default share of the datasheet memory bandwidth a decode step achieves (model bandwidth utilisation)."""
    if weight_bits <= 4:
        value, how = 0.50, ("gpt-fast int4 (group 32) batch 1 on A100: 862.69 and 1,097.66 of 2,039 GB/s = 42.3 "
                            "and 53.8 %, median 48 % → 50 % (dequantisation costs bandwidth)")
    else:
        value, how = 0.65, ("gpt-fast batch 1 on A100: Llama-2-7B bf16 1,397.31 and Llama-2-70B int8 1,322.58 of "
                            "2,039 GB/s = 68.5 and 64.9 %, median 66.7 % → 65 % (the A100s were power-limited to "
                            "330 W, so this errs low)")
    basis = "published" if generation == "ampere" else "extrapolated"
    if basis == "extrapolated":
        how = f"no published batch-1 bandwidth figure used for {generation or 'this GPU'}: the A100's ({how})"
    return Assumption("decode bandwidth efficiency", value, basis, (GPT_FAST,), how)


@formula("throughput.inference_compute_efficiency_default", "0.45 of the dense peak of the compute dtype",
         NIM_BENCH, where="Llama-3.3-70B fp8 TP2 on 2 H100, 5,000-token prompt, TTFT 406.77 ms",
         note="5,000 · (2·N + 4·L·H·Q·5,000) = 7.61e14 FLOPs in 406.77 ms on 2 × 1,979 TFLOP/s = 47 % → 45 %. "
              "The TTFT includes the server's own overheads, so this errs low. Other generations and dtypes: the "
              "same figure (extrapolated).")
def inference_compute_efficiency(generation: str | None, precision: str = "bf16") -> Assumption:
    """Default share of the dense peak a prefill (and a compute-bound decode step) achieves."""
    how = ("NIM (TensorRT-LLM) Llama-3.3-70B fp8 TP2 on 2 H100: a 5,000-token prompt's 7.61e14 FLOPs in 406.77 ms "
           "TTFT = 47 % of 2 × 1,979 TFLOP/s → 45 %")
    published = generation == "hopper" and compute_dtype(precision) == "fp8"
    if not published:
        how = f"no published prefill figure used for {generation or 'this GPU'} {compute_dtype(precision)}: {how}"
    return Assumption("prefill compute efficiency", 0.45, "published" if published else "extrapolated",
                      (NIM_BENCH,), how)


def defaults_table() -> list[dict]:
    """One row per GPU generation and precision class: the defaults and their basis, for the report's
    assumptions table (values as fractions; format them in the report)."""
    rows = []
    for generation in GENERATIONS:
        for precision in ("bf16", "fp8") if generation in FP8_GENERATIONS else ("bf16",):
            mfu = training_mfu(generation, precision)
            rows.append(dict(
                generation=generation, precision=precision,
                training_mfu=mfu.value, training_mfu_basis=mfu.basis,
                training_mfu_full_recompute=training_mfu(generation, precision, "full").value,
                decode_bandwidth_efficiency=decode_bandwidth_efficiency(generation, 8 if precision == "fp8" else 16)
                .value,
                decode_bandwidth_efficiency_basis=decode_bandwidth_efficiency(generation).basis,
                inference_compute_efficiency=inference_compute_efficiency(generation, precision).value,
                inference_compute_efficiency_basis=inference_compute_efficiency(generation, precision).basis,
                sources=", ".join(s.key for s in mfu.sources)))
    return rows
