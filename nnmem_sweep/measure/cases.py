"""The truth catalog: the measured cases committed under tests/data/truth/ (one JSON each, `nnmem-sweep truth`).

Each case names its inputs the way the estimator's grid does (columns.GRID_AXES) so accuracy.compare() can put the
estimate beside the measurement. Chosen to confirm one trap each (MEASURING.md, issue 7):
  - math-path attention on the CPU for GPT-2/BERT (attention dropout 0.1), flash for Llama/Qwen/Mixtral (dropout 0);
  - foreach AdamW temporaries in step() vs fused vs for-loop; optimizer state appearing at step 1;
  - autocast's cached 16-bit weight copies (bf16-mixed); fp32 upcast logits and a 152k vocabulary (Qwen);
  - causal LM vs masked LM vs sequence-classification heads; full checkpointing; prefill + decode with a KV cache.
Tolerances are the issue's targets: peak within 8 %, weights / gradients / optimizer state within 0.1 %.
"""
from __future__ import annotations

from typing import Any

PEAK_TOLERANCE = 0.08
STATE_TOLERANCE = 0.001

# A VGG-style CNN for 32x32 RGB images (CIFAR-10 shape), built from a layer list.
CNN_LAYERS: list[dict[str, Any]] = [
    {"type": "conv2d", "out_channels": 64, "kernel_size": 3, "padding": 1},
    {"type": "batchnorm2d"}, {"type": "relu"},
    {"type": "conv2d", "out_channels": 64, "kernel_size": 3, "padding": 1},
    {"type": "batchnorm2d"}, {"type": "relu"},
    {"type": "maxpool2d", "kernel_size": 2, "stride": 2},
    {"type": "conv2d", "out_channels": 128, "kernel_size": 3, "padding": 1},
    {"type": "batchnorm2d"}, {"type": "relu"},
    {"type": "maxpool2d", "kernel_size": 2, "stride": 2},
    {"type": "flatten"},
    {"type": "linear", "out_features": 256}, {"type": "relu"},
    {"type": "linear", "out_features": 10},
]


def _train(model: str, batch: int, seq: int, precision: str, optimizer: str = "adamw", impl: str = "foreach",
           ckpt: str = "none", attention: str = "flash", **extra: Any) -> dict[str, Any]:
    tag = f"{model}-train-{precision}-{optimizer}"
    if impl != "foreach":
        tag += f"-{impl}"
    if ckpt != "none":
        tag += f"-ckpt{ckpt}"
    if attention != "flash":
        tag += f"-{attention}"
    if extra.get("dropout_impl") == "native":
        tag += "-nativedropout"
    if extra.get("zero_grad") == "zeros":
        tag += "-zerograd"
    if "head" in extra:
        tag += "-" + extra["head"].removeprefix(model.split("-")[0].capitalize()).lower()
    return {"id": f"{tag}-b{batch}{_shape_tag(seq, extra)}", "model": model, "mode": "train", "batch": batch,
            "seq_len": seq, "precision": precision, "optimizer": optimizer, "optimizer_impl": impl,
            "checkpointing": ckpt, "attention": attention, "decode_tokens": 0, **extra}


def _shape_tag(seq: int, extra: dict[str, Any]) -> str:
    """-s<seq> (none for image models, seq 0), -t<decoder length> when an encoder-decoder's differs."""
    return (f"-s{seq}" if seq else "") + (f"-t{extra['decoder_seq_len']}" if "decoder_seq_len" in extra else "")


def _infer(model: str, batch: int, seq: int, precision: str, decode: int, attention: str = "flash",
           **extra: Any) -> dict[str, Any]:
    tag = f"{model}-infer-{precision}" + ("" if attention == "flash" else f"-{attention}")
    return {"id": f"{tag}-b{batch}{_shape_tag(seq, extra)}" + (f"-d{decode}" if decode else ""), "model": model,
            "mode": "infer", "batch": batch, "seq_len": seq, "precision": precision, "optimizer": "none",
            "optimizer_impl": "foreach", "checkpointing": "none", "attention": attention, "decode_tokens": decode,
            **extra}


CASES: list[dict[str, Any]] = [
    # GPT-2 small / medium: attention dropout 0.1, so CPU SDPA takes the math path (s x s tensors materialised)
    _train("gpt2", 4, 512, "fp32"),
    _train("gpt2", 1, 128, "fp32", "sgd"),
    _train("gpt2", 8, 1024, "bf16-mixed"),
    _train("gpt2", 8, 1024, "fp32", ckpt="full"),
    _infer("gpt2", 4, 512, "fp32", 16),
    _train("gpt2-medium", 2, 1024, "bf16"),
    _train("gpt2-medium", 4, 512, "fp32", "adam", attention="eager"),
    # GPU-faithful dropout: eager attention and CUDA's fused dropout (1-byte bool masks), so the s x s tensors and
    # the masks are those a GPU run keeps (the CPU's composite dropout keeps input-dtype masks)
    _train("gpt2", 4, 512, "fp32", attention="eager", dropout_impl="native"),
    _train("gpt2-medium", 2, 1024, "bf16", attention="eager", dropout_impl="native"),
    _train("bert-base", 32, 128, "fp32", attention="eager", dropout_impl="native"),
    _train("bert-large", 16, 128, "bf16", "adafactor", attention="eager", dropout_impl="native"),
    # BERT base / large: masked-LM head, one sequence-classification head
    _train("bert-base", 32, 128, "fp32"),
    _train("bert-base", 16, 512, "bf16-mixed"),
    _train("bert-base", 8, 128, "fp32", "sgd-momentum", ckpt="full"),
    _train("bert-base", 32, 128, "fp32", head="BertForSequenceClassification"),
    _train("bert-large", 8, 512, "fp32"),
    _train("bert-large", 16, 128, "bf16", "adafactor"),
    # Llama 3.2 1B: GQA 32/8, tied embeddings, 128k vocabulary
    _train("llama-3.2-1b", 1, 2048, "bf16"),
    _train("llama-3.2-1b", 4, 1024, "bf16-mixed"),
    _train("llama-3.2-1b", 2, 512, "bf16", attention="eager"),
    _train("llama-3.2-1b", 8, 2048, "bf16", ckpt="full"),
    _train("llama-3.2-1b", 2, 512, "fp32", "sgd-momentum"),
    _train("llama-3.2-1b", 4, 1024, "bf16", "adafactor"),
    _train("llama-3.2-1b", 1, 2048, "bf16", impl="fused"),
    _train("llama-3.2-1b", 1, 2048, "bf16", impl="forloop"),
    _infer("llama-3.2-1b", 1, 2048, "bf16", 32),
    _infer("llama-3.2-1b", 16, 512, "bf16", 16),
    # Llama 3.1 8B
    _train("llama-3.1-8b", 1, 2048, "bf16"),
    _train("llama-3.1-8b", 4, 4096, "bf16", ckpt="full"),
    _train("llama-3.1-8b", 1, 1024, "bf16-mixed"),
    _train("llama-3.1-8b", 1, 8192, "bf16", "sgd"),
    # full checkpointing, the backward's peak in a recomputed block (components/recompute.py); autocast's copies
    *[_train(m, b, s, p, o, ckpt="full") for m, b, s, p, o in (("llama-3.1-8b", 2, 4096, "bf16-mixed", "sgd"),
      ("mistral-7b", 8, 2048, "bf16", "sgd"), ("llama-3.2-1b", 8, 2048, "bf16-mixed", "adamw"),
      ("llama-3.2-1b", 2, 2048, "fp32", "sgd"))],
    _infer("llama-3.1-8b", 8, 4096, "bf16", 16),
    _infer("llama-3.1-8b", 1, 128, "bf16", 8),
    # Qwen2.5 0.5B: tied embeddings and a 152k vocabulary, so the fp32 loss is the peak
    _train("qwen2.5-0.5b", 4, 1024, "bf16"),
    _train("qwen2.5-0.5b", 8, 2048, "bf16-mixed"),
    _train("qwen2.5-0.5b", 2, 512, "fp32", "adam"),
    _infer("qwen2.5-0.5b", 4, 1024, "bf16", 16),
    # a reduced Mixtral-style MoE (8 experts, top-2)
    _train("mixtral-small", 2, 512, "bf16"),
    _train("mixtral-small", 4, 512, "bf16", ckpt="full"),  # fp32: the grouped_mm meta kernel takes bf16 only
    _train("mixtral-small", 8, 1024, "bf16"),  # activations above the states: the forward's and backward's peaks
    _train("mixtral-small", 16, 1024, "bf16", ckpt="full"),
    _infer("mixtral-small", 4, 256, "bf16", 8),
    # a CNN from a layer list
    {"id": "cnn-vgg-cifar-train-fp32-sgd-momentum-b64", "model": "cnn-vgg-cifar", "layers": CNN_LAYERS,
     "input_shape": [3, 32, 32], "num_classes": 10, "mode": "train", "batch": 64, "seq_len": 0,
     "precision": "fp32", "optimizer": "sgd-momentum", "optimizer_impl": "foreach", "checkpointing": "none",
     "attention": "flash", "decode_tokens": 0},
    {"id": "cnn-vgg-cifar-train-fp32-adamw-b256", "model": "cnn-vgg-cifar", "layers": CNN_LAYERS,
     "input_shape": [3, 32, 32], "num_classes": 10, "mode": "train", "batch": 256, "seq_len": 0,
     "precision": "fp32", "optimizer": "adamw", "optimizer_impl": "foreach", "checkpointing": "none",
     "attention": "flash", "decode_tokens": 0},
]


# LoRA through peft (get_peft_model over the same transformers model): frozen base, adapters trained by the optimizer
# over the trainable parameters only. Written under tests/data/truth/finetune/ (FINETUNE_DIR), apart from the full
# fine-tuning cases, until the estimator's grid has a finetune axis to compare them with.
FINETUNE_DIR = "finetune"


def _lora(model: str, batch: int, seq: int, precision: str, rank: int, targets: tuple[str, ...], alpha: int = 16,
          dropout: float = 0.0, adapter_dtype: str = "fp32", modules_to_save: tuple[str, ...] = (),
          method: str = "lora", **train: Any) -> dict[str, Any]:
    case = _train(model, batch, seq, precision, **train)
    where = "all" if targets == ("all-linear",) else "".join(t.split("_")[0][0] for t in targets)
    tag = f"{method}-r{rank}-{where}" + (f"-drop{dropout:g}" if dropout else "") + \
        ("" if adapter_dtype == "fp32" else f"-adapter{adapter_dtype}") + \
        ("".join(f"-save{m.replace('_', '')}" for m in modules_to_save))
    case["id"] = case["id"].replace(f"{model}-train-", f"{model}-{tag}-train-", 1)
    case["finetune"] = {"method": method, "rank": rank, "alpha": alpha, "targets": list(targets),
                        "dropout": dropout, "adapter_dtype": adapter_dtype,
                        **({"modules_to_save": list(modules_to_save)} if modules_to_save else {})}
    return case


QV = ("q_proj", "v_proj")
ALL_LINEAR = ("all-linear",)
FINETUNE_CASES: list[dict[str, Any]] = [
    _lora("qwen2.5-0.5b", 4, 1024, "bf16", 8, QV),
    _lora("llama-3.2-1b", 2, 1024, "bf16", 64, ALL_LINEAR),
    _lora("llama-3.2-1b", 1, 512, "fp32", 8, QV),
    _lora("llama-3.2-1b", 4, 1024, "bf16", 16, QV, ckpt="full"),
    _lora("qwen2.5-0.5b", 2, 1024, "bf16-mixed", 8, QV),
    _lora("llama-3.2-1b", 2, 512, "bf16", 8, ALL_LINEAR, dropout=0.05, dropout_impl="native"),
    # adapters in the model's dtype (autocast_adapter_dtype=False) on layers whose inputs other ops already keep
    _lora("llama-3.2-1b", 2, 1024, "bf16", 8, ("o_proj", "down_proj"), adapter_dtype="model"),
    # GPT-2's fused c_attn (Conv1D), eager attention with CUDA-style dropout masks
    _lora("gpt2", 4, 512, "fp32", 8, ("c_attn",), attention="eager", dropout_impl="native"),
    # families planned from their own code with peft's adapters on them (issue 23): Qwen3 (q/k norms) on every
    # linear with dropout; Gemma 2 (soft-capped logits, alternating sliding-window layers) with full checkpointing;
    # trainable extras (peft's modules_to_save: the final norm and the untied-by-peft LM head copied and trained)
    _lora("qwen3-0.6b", 4, 2048, "bf16", 16, ALL_LINEAR, dropout=0.05, dropout_impl="native"),
    _lora("gemma-2-2b", 2, 1024, "bf16", 8, QV, ckpt="full", attention="eager"),
    _lora("qwen3-0.6b", 2, 1024, "bf16", 8, QV, modules_to_save=("lm_head", "norm")),
    # issue 21's 7B decoder: dropout 0.1 on q/k/v/o, full checkpointing, at Mistral's sliding window (4096), where
    # transformers materialises an s x s mask for SDPA (activations.sliding_window_mask)
    _lora("mistral-7b", 1, 4096, "bf16", 16, ("q_proj", "k_proj", "v_proj", "o_proj"), alpha=32, dropout=0.1,
          dropout_impl="native", ckpt="full"),
    # autocast with full checkpointing: the LM head's 16-bit copy is kept into the backward, the adapters' casts
    # are not (finetune.frozen_autocast_copies, forward_autocast_cache)
    _lora("llama-3.2-1b", 2, 1024, "bf16-mixed", 16, ("q_proj", "k_proj", "v_proj", "o_proj"), ckpt="full"),
    # gradient accumulation (4 micro-batches per optimizer step): the adapters' gradients live through the later
    # micro-batches, a hand-modelled family and one planned from its own code
    {**_lora("llama-3.2-1b", 4, 1024, "bf16", 16, ALL_LINEAR), "gradient_accumulation": 4},
    {**_lora("qwen3-0.6b", 4, 1024, "bf16", 16, ALL_LINEAR), "gradient_accumulation": 4},
    # QLoRA (workload/qlora.py): the base's linears in NF4 as bitsandbytes stores them, the rest in fp32 as
    # prepare_model_for_kbit_training leaves it, the matmul as bitsandbytes runs a training step on CUDA; a
    # hand-modelled family and one planned from its own code, with and without checkpointing
    _lora("llama-3.2-1b", 2, 2048, "bf16", 16, ALL_LINEAR, alpha=32, method="qlora"),
    _lora("qwen3-0.6b", 2, 1024, "bf16", 16, ALL_LINEAR, alpha=32, method="qlora", ckpt="full"),
]
# preference tuning (workload/preference.py, as TRL runs it): batch preference pairs, chosen and rejected through the
# policy in one forward; DPO with a frozen copy of the model as its reference, DPO on LoRA with the adapters disabled
# as the reference, reference-free SimPO
def _pref(case: dict[str, Any], loss: str, reference: str | None = None) -> dict[str, Any]:
    spec = {"loss": loss, **({"reference": reference} if reference else {})}
    tag = loss + (f"-ref{reference}" if reference else "")
    return {**case, "id": case["id"].replace("-train-", f"-{tag}-train-", 1), "preference": spec}


FINETUNE_CASES += [
    _pref(_train("qwen3-0.6b", 2, 1024, "bf16"), "dpo", "model"),
    _pref(_lora("qwen3-0.6b", 2, 1024, "bf16", 8, QV), "dpo", "adapters"),
    _pref(_train("qwen3-0.6b", 2, 1024, "bf16"), "simpo"),
]
for _c in FINETUNE_CASES:
    if _c.get("gradient_accumulation", 1) > 1:
        _c["id"] = _c["id"].replace("-train-", f"-accum{_c['gradient_accumulation']}-train-", 1)
CASES += FINETUNE_CASES

# One rank of a step sharded by FSDP2 (workload/fsdp.py, issue 22): fully_shard per decoder block and the root over
# PyTorch's fake process group, FSDPMemTracker, the optimizer over the rank's local shards. Written under
# tests/data/truth/sharded/ (SHARDED_DIR): the estimate of sharded layouts is compared with them in `make accuracy`
# (docs/accuracy.md), not yet held to them. Full fine-tunes of a hand-modelled family over 2, 4 and 8 ranks,
# FULL_SHARD (zero_stage 3) and SHARD_GRAD_OP (2), with and without checkpointing; LoRA and QLoRA of Qwen3.
SHARDED_DIR = "sharded"


def _fsdp(case: dict[str, Any], world: int, stage: int) -> dict[str, Any]:
    return {**case, "id": case["id"].replace("-train-", f"-fsdp{world}z{stage}-train-", 1),
            "fsdp": {"world": world, "zero_stage": stage}}


def _fsdp1(case: dict[str, Any], world: int, stage: int, orig: bool = False) -> dict[str, Any]:
    return {**case, "id": case["id"].replace("-train-", f"-fsdp1w{world}z{stage}{'orig' if orig else ''}-train-", 1),
            "fsdp": {"world": world, "zero_stage": stage, "version": 1, **({"use_orig_params": True} if orig else {})}}


def _offloaded(case: dict[str, Any]) -> dict[str, Any]:
    """An FSDP case offloaded to the host (workload/fsdp.py): FSDP1's CPUOffload(offload_params=True), as Answer.AI's
    FSDP-QLoRA runs it, or FSDP2's CPUOffloadPolicy."""
    return {**case, "id": case["id"].replace("-train-", "-offload-train-", 1),
            "fsdp": {**case["fsdp"], "offload": "optimizer+params"}}


def _unprefetched(case: dict[str, Any]) -> dict[str, Any]:
    """An FSDP1 case without backward prefetch (backward_prefetch=None), as accelerate's FSDP plugin and the Trainer
    pass it unless fsdp_backward_prefetch is set (workload/fsdp.py)."""
    return {**case, "id": case["id"].replace("-train-", "-noprefetch-train-", 1),
            "fsdp": {**case["fsdp"], "backward_prefetch": "none"}}


SHARDED_CASES: list[dict[str, Any]] = [
    _fsdp(_train("llama-3.2-1b", 2, 1024, "bf16", ckpt=ck), w, z)
    for w in (2, 4, 8) for z in (2, 3) for ck in ("none", "full")
] + [  # a short sequence: the backward's peak past the loss, in the blocks' backward or at its end
    _fsdp(_train("llama-3.2-1b", 2, 128, "bf16"), w, z) for w in (2, 4) for z in (2, 3)
] + [  # FSDP1, accelerate's default (workload/fsdp.py _shard_fsdp1; layout fsdp_version 1: parallel/fsdp.py)
    _fsdp1(_train("llama-3.2-1b", 2, s, "bf16"), w, z) for w in (2, 4) for s in (1024, 128) for z in (2, 3)
] + [  # ... an untied head's root over 8 ranks (FULL_SHARD: the root's concatenation, 2·root, the step's peak)
    _fsdp1(_train("llama-3.1-8b", 2, 128, "bf16"), 8, z) for z in (2, 3)
] + [  # ... with every layer checkpointed
    _fsdp1(_train("llama-3.2-1b", 2, s, "bf16", ckpt="full"), 2, z) for s in (1024, 128) for z in (2, 3)
] + [  # ... with use_orig_params, the Trainer's default: FULL_SHARD (SHARD_GRAD_OP's views fail under fake tensors)
    _fsdp1(_train("llama-3.1-8b", 2, 128, "bf16"), 8, 3, orig=True),
    _fsdp1(_train("llama-3.2-1b", 2, 1024, "bf16", ckpt="full"), 2, 3, orig=True),
    _fsdp1(_train("llama-3.2-1b", 2, 1024, "bf16"), 4, 3, orig=True),
] + [  # ... and an untied head's (Llama 3.1 8B: the root holds the embedding and the head)
    _fsdp(_train("llama-3.1-8b", 2, 128, "bf16"), 8, z) for z in (2, 3)
] + [
    _fsdp(_lora("qwen3-0.6b", 2, 1024, "bf16", 16, ALL_LINEAR, alpha=32), 2, 3),
    _fsdp(_lora("qwen3-0.6b", 2, 1024, "bf16", 16, ALL_LINEAR, alpha=32, method="qlora", ckpt="full"), 4, 3),
] + [  # gradient accumulation under FSDP2: every micro-batch reduce-scatters into the rank's kept gradient shards
    {**_fsdp(_lora("qwen3-0.6b", 2, 1024, "bf16", 16, ALL_LINEAR, alpha=32), 2, 3), "gradient_accumulation": 4},
    {**_fsdp(_train("llama-3.2-1b", 2, 1024, "bf16"), 2, 3), "gradient_accumulation": 2},
] + [  # ... or only the last micro-batch's (accelerate's no_sync, its default): whole unsharded gradients until then
    {**_fsdp(_lora("qwen3-0.6b", 2, 1024, "bf16", 16, ALL_LINEAR, alpha=32), 2, 3), "gradient_accumulation": 4,
     "gradient_sync": "last"},
    {**_fsdp(_train("llama-3.2-1b", 2, 1024, "bf16"), 2, 3), "gradient_accumulation": 2, "gradient_sync": "last"},
    {**_fsdp(_train("llama-3.2-1b", 2, 1024, "bf16"), 4, 3), "gradient_accumulation": 2, "gradient_sync": "last"},
    {**_fsdp(_train("llama-3.2-1b", 2, 1024, "bf16"), 2, 2), "gradient_accumulation": 2, "gradient_sync": "last"},
    # a family planned from its own code under SHARD_GRAD_OP, with its twin without accumulation: the traced '+nosync'
    _fsdp(_train("qwen3-0.6b", 2, 1024, "bf16"), 2, 2),
    {**_fsdp(_train("qwen3-0.6b", 2, 1024, "bf16"), 2, 2), "gradient_accumulation": 2, "gradient_sync": "last"},
] + [  # a family planned from its own code under FSDP1 (its rank's step traced the same way: derive/arch.py sharded)
    _fsdp1(_train("qwen3-0.6b", 2, 1024, "bf16"), 2, z) for z in (3, 2)
] + [  # ... and LoRA on it, wrapped as the Trainer wraps it (peft's fsdp_auto_wrap_policy: workload/fsdp.py): the
    # frozen base's root and first block stay unsharded after the backward (FINDINGS.md)
    _fsdp1(_lora("qwen3-0.6b", 2, 1024, "bf16", 16, ALL_LINEAR, alpha=32), 2, z) for z in (3, 2)
] + [  # ... its FSDP2 twin under SHARD_GRAD_OP, and a hand-modelled family's adapters under both versions (the Trainer's
    # wrap; its rank's step traced the same way): what FSDP1 holds beside FSDP2's moments (FINDINGS.md)
    _fsdp(_lora("qwen3-0.6b", 2, 1024, "bf16", 16, ALL_LINEAR, alpha=32), 2, 2),
] + [f(_lora("llama-3.2-1b", 2, 1024, "bf16", 16, QV, ckpt=ck), 2, z) for f in (_fsdp, _fsdp1) for z in (3, 2)
     for ck in ("none", "full")
] + [f(_lora("llama-3.1-8b", 2, 128, "bf16", 16, QV), 8, 3) for f in (_fsdp, _fsdp1)
] + [  # FSDP-QLoRA under FSDP1 (bitsandbytes' quant storage in the model's dtype, no fp32 cast: workload/qlora.py)
    _fsdp1(_lora("qwen3-0.6b", 2, 1024, "bf16", 16, ALL_LINEAR, alpha=32, method="qlora", ckpt="full"), 4, 3),
    _fsdp1(_lora("qwen3-0.6b", 2, 1024, "bf16", 16, ALL_LINEAR, alpha=32, method="qlora"), 2, 3),
] + [  # other hand-modelled families under FSDP (a 4-layer Mixtral: MoE blocks; GPT-2 medium: Conv1D, learned
    # positions, a tied head): what the Llama-measured moments miss there (FINDINGS.md)
    f(_train(m, 2, s, "bf16"), 2, 3) for m, s in (("mixtral-small", 512), ("gpt2-medium", 1024))
    for f in (_fsdp, _fsdp1)
] + [  # the MoE block at other shapes, ranks and strategies (parallel.fsdp2_last_block_experts)
    _fsdp(_train("mixtral-small", 4, 1024, "bf16"), 4, 3),
    _fsdp(_train("mixtral-small", 2, 512, "bf16"), 2, 2),
    _fsdp(_train("mixtral-small", 4, 1024, "bf16", ckpt="full"), 2, 3),
    _fsdp1(_train("mixtral-small", 4, 1024, "bf16"), 4, 3),
] + [  # accumulation under FSDP1: every micro-batch reduce-scattered, or the flat gradients kept whole (no_sync())
    {**_fsdp1(_train("llama-3.2-1b", 2, 1024, "bf16"), 2, 3), "gradient_accumulation": 2},
    {**_fsdp1(_train("llama-3.2-1b", 2, 1024, "bf16"), 2, 3), "gradient_accumulation": 2, "gradient_sync": "last"},
    {**_fsdp1(_train("llama-3.2-1b", 2, 1024, "bf16"), 2, 2), "gradient_accumulation": 2, "gradient_sync": "last"},
    {**_fsdp1(_train("qwen3-0.6b", 2, 1024, "bf16"), 2, 3), "gradient_accumulation": 2},
    {**_fsdp1(_train("qwen3-0.6b", 2, 1024, "bf16"), 2, 3), "gradient_accumulation": 2, "gradient_sync": "last"},
] + [  # FSDP1's CPU offload (issue 22): LoRA as the Trainer wraps it, both strategies, and FSDP-QLoRA as Answer.AI
    # runs it (full checkpointing), the GPU's side measured on one device (measure/truth.py gpu_side)
    _offloaded(_fsdp1(_lora("llama-3.2-1b", 2, 1024, "bf16", 16, QV, ckpt=ck), 2, z)) for z in (3, 2)
    for ck in ("none", "full")
] + [
    _offloaded(_fsdp1(_lora("qwen3-0.6b", 2, 1024, "bf16", 16, ALL_LINEAR, alpha=32, method="qlora", ckpt="full"), 2,
                      3)),
] + [  # a hand-modelled family's full fine-tune offloaded, both strategies
    _offloaded(_fsdp1(_train("llama-3.2-1b", 2, 1024, "bf16"), 2, z)) for z in (3, 2)
] + [  # FSDP2's CPUOffloadPolicy: LoRA both strategies (one checkpointed), a full fine-tune
    _offloaded(_fsdp(_lora("llama-3.2-1b", 2, 1024, "bf16", 16, QV, ckpt=ck), 2, z)) for z, ck in ((3, "none"),
                                                                                              (2, "full"))
] + [
    _offloaded(_fsdp(_train("llama-3.2-1b", 2, 1024, "bf16"), 2, 3)),
] + [  # FSDP1 without backward prefetch (accelerate's and the Trainer's default; layout backward_prefetch none):
    # FULL_SHARD over 2, 4 and 8 ranks, ± checkpointing, SHARD_GRAD_OP, traced steps (Qwen3 0.6B; Llama 1B's LoRA)
    _unprefetched(_fsdp1(_train("llama-3.2-1b", 2, s, "bf16", ckpt=ck), w, 3)) for w in (2, 4) for s in (1024, 128)
    for ck in ("none", "full") if w == 2 or ck == "none"
] + [
    _unprefetched(_fsdp1(_train("llama-3.1-8b", 2, 128, "bf16"), 8, 3)),
    _unprefetched(_fsdp1(_train("llama-3.2-1b", 2, 1024, "bf16"), 2, 2)),
    _unprefetched(_fsdp1(_train("qwen3-0.6b", 2, 1024, "bf16"), 2, 3)),
    _unprefetched(_fsdp1(_lora("llama-3.2-1b", 2, 1024, "bf16", 16, QV), 2, 3)),
] + [  # ... and an MoE's, whose blocks outweigh its root (the blocks' backward, not the root's, holds the peak), with
    # every layer checkpointed, both ways
    f(_fsdp1(_train("mixtral-small", 2, s, "bf16", ckpt="full"), 2, 3)) for f in (dict, _unprefetched)
    for s in (128, 1024)
]
for _c in SHARDED_CASES:
    if _c.get("gradient_accumulation", 1) > 1:
        sync = "nosync" if _c.get("gradient_sync") == "last" else ""
        _c["id"] = _c["id"].replace("-train-", f"-accum{_c['gradient_accumulation']}{sync}-train-", 1)
CASES += SHARDED_CASES

# One rank of a step under DeepSpeed's own ZeRO-1/2 engine (workload/zero_engine.py, measure/zero_step.py; issue 22),
# bf16 with the fp32 partition and AdamW state over it (the recipe bf16-master), written under
# tests/data/truth/deepspeed/ (DEEPSPEED_DIR). Llama 3.2 1B (tied head) at a long sequence (the activations' peak)
# and a short one (the backward's end and the step), DeepSpeed's default reduce bucket and one smaller than the
# embedding; Llama 3.1 8B (untied head), short, over 2 ranks, and long over 8; LoRA of Llama 3.2 1B.
DEEPSPEED_DIR = "deepspeed"
DEEPSPEED_TOLERANCE = {"peak": 0.005, "states": 0.001}  # one rank's peak: issue 22's 0.5 %


def _zero(model: str, seq: int, world: int, stage: int, bucket: int = 500_000_000,
          lora: tuple[str, ...] = (), accum: int = 1, ckpt: str = "none", overlap: bool = False,
          offload: bool = False) -> dict[str, Any]:
    # LoRA: the adapters in the model's dtype, to which DeepSpeed's bf16 engine casts them whatever peft made
    case = _lora(model, 2, seq, "bf16-master", 16, lora, alpha=32, adapter_dtype="model", ckpt=ckpt) if lora else \
        _train(model, 2, seq, "bf16-master", ckpt=ckpt)
    tag = f"-ds{world}z{stage}" + ("" if bucket == 500_000_000 else f"r{bucket:.0e}".replace("+", "")) + \
        ("ov" if overlap else "") + ("-offload" if offload else "") + (f"-accum{accum}" if accum > 1 else "")
    return {**case, "id": case["id"].replace("-train-", f"{tag}-train-", 1), "tolerance": DEEPSPEED_TOLERANCE,
            "deepspeed": {"world": world, "zero_stage": stage, "reduce_bucket_size": bucket,
                          **({"overlap_comm": True} if overlap else {}),
                          **({"offload": "optimizer"} if offload else {})},
            **({"gradient_accumulation": accum} if accum > 1 else {})}


DEEPSPEED_CASES: list[dict[str, Any]] = [
    *[_zero("llama-3.2-1b", 1024, w, z) for w in (2, 4) for z in (1, 2)],
    _zero("llama-3.2-1b", 64, 2, 2), _zero("llama-3.2-1b", 64, 2, 1, 10_000_000),
    _zero("llama-3.2-1b", 64, 2, 2, 10_000_000),
    _zero("llama-3.1-8b", 64, 2, 2), _zero("llama-3.1-8b", 1024, 8, 2),
    # ZeRO-3: real tensors (it does not partition fake ones), so a 1B model over 2 ranks at a short sequence
    _zero("llama-3.2-1b", 128, 2, 3), _zero("llama-3.2-1b", 512, 2, 3),
    # LoRA: the frozen base whole on every rank, the adapters' states partitioned, the reduce bucket whole
    _zero("llama-3.2-1b", 1024, 2, 2, lora=QV), _zero("llama-3.2-1b", 64, 2, 2, lora=QV),
    _zero("llama-3.2-1b", 64, 4, 1, lora=QV), _zero("llama-3.2-1b", 64, 2, 2, 10_000_000, lora=QV),
    _zero("llama-3.2-1b", 1024, 4, 2, lora=ALL_LINEAR),
    # LoRA under ZeRO-3: the frozen base partitioned and gathered like a full fine-tune's, real tensors as above
    _zero("llama-3.2-1b", 128, 2, 3, lora=QV), _zero("llama-3.2-1b", 512, 4, 3, lora=ALL_LINEAR),
    # accumulation (gradient_accumulation_steps 2): what a micro-batch finds kept from the one before
    _zero("llama-3.2-1b", 1024, 2, 2, accum=2), _zero("llama-3.2-1b", 1024, 2, 1, accum=2),
    _zero("llama-3.2-1b", 1024, 2, 2, lora=QV, accum=2), _zero("llama-3.2-1b", 64, 2, 2, lora=QV, accum=2),
    _zero("llama-3.2-1b", 128, 2, 3, lora=QV, accum=2),
    # full activation checkpointing, as large models are fine-tuned under ZeRO: the recomputed layer in the backward
    # beside the last rank's partition, and the reserve of such a step
    _zero("llama-3.2-1b", 2048, 2, 2, ckpt="full"), _zero("llama-3.1-8b", 4096, 8, 2, ckpt="full"),
    _zero("llama-3.2-1b", 2048, 4, 1, ckpt="full"),
    # an untied head smaller than the bucket (Mistral 7B's 131 M elements): the first bucket after one layer
    _zero("mistral-7b", 1024, 8, 2),
    # overlap_comm: two reduce buckets, the reduction on a stream of its own (the CPU's streams run in order)
    _zero("llama-3.2-1b", 1024, 2, 2, overlap=True), _zero("llama-3.2-1b", 64, 2, 2, overlap=True),
    # ZeRO-Offload (offload_optimizer to the CPU): the GPU side of the rank, its host storages told apart
    # (workload/zero_engine.py host_side): the fp64 copy of each gradient for the norm as it is reduced, beside the
    # bucket and the GPU buffer of the largest gradient; the step on the host
    _zero("llama-3.2-1b", 64, 2, 2, offload=True), _zero("llama-3.2-1b", 1024, 2, 2, offload=True),
    _zero("llama-3.2-1b", 64, 4, 1, offload=True), _zero("llama-3.1-8b", 64, 2, 2, offload=True),
    _zero("llama-3.2-1b", 2048, 2, 2, ckpt="full", offload=True),
    _zero("llama-3.2-1b", 1024, 2, 2, accum=2, offload=True), _zero("llama-3.2-1b", 64, 2, 2, lora=QV, offload=True),
    _zero("llama-3.2-1b", 1024, 4, 2, lora=ALL_LINEAR, offload=True),
    _zero("llama-3.2-1b", 64, 2, 2, overlap=True, offload=True),
    _zero("llama-3.2-1b", 1024, 2, 1, accum=2, offload=True),
    _zero("llama-3.2-1b", 64, 4, 1, overlap=True, offload=True),
    _zero("llama-3.2-1b", 1024, 2, 2, lora=QV, accum=2, offload=True),
]
CASES += DEEPSPEED_CASES


# The families issue 12 plans from the model's own code (no hand reader in models/hf.py): real published configs
# (the presets) where they trace in seconds, the big MoE models at their real widths with fewer layers / experts
# (hf_configs.REDUCED says what was cut). Shapes are well above the derive package's small probes (b 2-8 or more,
# s 512-12288), so each case is a held-out point for a derived plan. Recipes vary across the cases; MoE models run
# bf16 only (transformers' grouped_mm experts: torch's meta kernel takes bf16 only). Findings per family:
# tests/data/truth/FINDINGS.md, "New families".
RESNET50 = {"module": "torchvision.models:resnet50", "kwargs": {"num_classes": 1000}, "input_shape": [3, 224, 224]}
NATIVE = {"dropout_impl": "native"}  # CUDA's dropout kernel (1-byte masks) where the published config has dropout
FAMILY_CASES: list[dict[str, Any]] = [
    # OPT-350m: post-LN (do_layer_norm_before false), ReLU, 512-wide embeddings projected in and out, dropout 0.1
    _train("opt-350m", 4, 1024, "fp32", **NATIVE),
    _train("opt-350m", 8, 2048, "bf16-mixed", "sgd-momentum", ckpt="full", **NATIVE),
    _infer("opt-350m", 8, 1024, "fp32", 16),
    # Pythia 1.4B (GPT-NeoX): parallel residual, rotary on 25 % of each head, untied 50k vocabulary
    _train("pythia-1.4b", 4, 2048, "bf16"),
    _train("pythia-1.4b", 2, 2048, "bf16-mixed", "adafactor", attention="eager"),
    _infer("pythia-1.4b", 8, 2048, "bf16", 16),
    # StarCoder 15.5B (GPTBigCode): multi-query attention (one K/V head), fused c_attn, dropout 0.1
    _train("starcoder", 2, 1024, "bf16", attention="eager", **NATIVE),
    _train("starcoder", 4, 2048, "bf16", "sgd", ckpt="full", attention="eager", **NATIVE),
    _infer("starcoder", 4, 4096, "bf16", 16),
    # Qwen3 0.6B: QK-norm, head_dim 128 > hidden / heads, tied 152k vocabulary
    _train("qwen3-0.6b", 4, 2048, "bf16"),
    _train("qwen3-0.6b", 2, 1024, "fp32", impl="fused", attention="eager"),
    _infer("qwen3-0.6b", 8, 1024, "bf16", 16),
    # Qwen3-30B-A3B at its real widths, 4 layers: 128 experts top-8, moe_intermediate 768
    _train("qwen3-30b-a3b-4l", 2, 1024, "bf16"),
    _train("qwen3-30b-a3b-4l", 4, 2048, "bf16", "sgd-momentum", ckpt="full"),
    _infer("qwen3-30b-a3b-4l", 4, 1024, "bf16", 8),
    # Gemma 3 1B: 5 sliding-window layers (512) per global layer, 262k vocabulary, sandwich norms; s > window
    _train("gemma-3-1b", 2, 2048, "bf16"),
    _train("gemma-3-1b", 4, 1024, "bf16-mixed", attention="eager"),
    _infer("gemma-3-1b", 4, 2048, "bf16", 16),
    # Gemma 2 2B: attention and final-logit soft-capping (eager only: SDPA cannot soft-cap), sliding window 4096
    # on alternate layers, 256k vocabulary; s > window
    _train("gemma-2-2b", 1, 8192, "bf16", attention="eager"),
    _infer("gemma-2-2b", 2, 6144, "bf16", 8, attention="eager"),
    # Phi-3 mini: fused qkv_proj and gate_up_proj, sliding window 2047; s > window
    _train("phi-3-mini", 2, 4096, "bf16"),
    _train("phi-3-mini", 4, 1024, "bf16-mixed", "adafactor", ckpt="full"),
    _infer("phi-3-mini", 8, 2048, "bf16", 16),
    # DeepSeek-V3 at its real widths, 4 layers, 64 routed experts: MLA (q/kv LoRA ranks 1536/512, rope 64 + nope 128
    # per head, v 128), 1 shared expert, sigmoid group-limited routing
    _train("deepseek-v3-4l-64e", 1, 2048, "bf16"),
    _train("deepseek-v3-4l-64e", 2, 1024, "bf16", "sgd-momentum", ckpt="full"),
    _infer("deepseek-v3-4l-64e", 2, 2048, "bf16", 8),
    # Llama 4 Scout at its real widths, 4 layers: chunked attention (8192) on RoPE layers, every 4th layer NoPE with
    # full attention, MoE with a shared expert in every layer, 202k vocabulary; s > chunk
    _train("llama-4-scout-4l", 1, 12288, "bf16"),
    _train("llama-4-scout-4l", 2, 2048, "bf16", ckpt="full"),
    _infer("llama-4-scout-4l", 1, 10240, "bf16", 8),
    # T5 base: encoder-decoder, relative position bias, dropout 0.1; labels shifted into the decoder inputs
    _train("t5-base", 8, 512, "fp32", attention="eager", decoder_seq_len=128, **NATIVE),
    _train("t5-base", 16, 512, "bf16", "adafactor", attention="eager", **NATIVE),
    _infer("t5-base", 8, 512, "fp32", 32),
    # ViT-B/16 (HF): 224 px, 197 tokens, 1000 labels
    _train("vit-base-16", 64, 0, "fp32"),
    _train("vit-base-16", 128, 0, "bf16-mixed", "sgd-momentum", ckpt="full"),
    _infer("vit-base-16", 256, 0, "bf16", 0),
    # ResNet-50 (torchvision, a `module:` model): cross-entropy over 1000 classes. Not bf16-mixed: torch's fake
    # batch-norm kernel keeps 16-bit mean/invstd where the CPU kernel keeps fp32 (FINDINGS.md)
    _train("resnet-50", 64, 0, "fp32", "sgd-momentum", **RESNET50),
    _train("resnet-50", 32, 0, "bf16", **RESNET50),
    _infer("resnet-50", 128, 0, "fp32", 0, **RESNET50),
]
CASES += FAMILY_CASES

# Gradients kept between steps (issue 13): optimizer.zero_grad(set_to_none=False), torch < 2.0's default (and DDP's
# gradient_as_bucket_view buckets): the zeroed gradients stay allocated through step 2's forward and backward
# accumulates into them. Each beside its set_to_none twin above (same shapes), so the difference is the measurement.
ZEROS = {"zero_grad": "zeros"}
ZERO_GRAD_CASES: list[dict[str, Any]] = [
    _train("bert-large", 8, 512, "fp32", **ZEROS),
    _train("llama-3.2-1b", 1, 2048, "bf16", **ZEROS),
    _train("llama-3.2-1b", 4, 1024, "bf16-mixed", **ZEROS),
    _train("qwen3-0.6b", 4, 2048, "bf16", **ZEROS),
    _lora("qwen2.5-0.5b", 4, 1024, "bf16", 8, QV, **ZEROS),
    _train("llama-3.2-1b", 8, 2048, "bf16", ckpt="full", **ZEROS),  # the recomputed last layer beside G
    # small b·s, so the LM head's new weight gradient beside all of G (backward right after the loss) is the peak:
    # GPT-2's tied head (hand-modelled), Pythia's untied one (derived)
    _train("gpt2", 1, 128, "fp32", "sgd", **ZEROS),
    _train("pythia-1.4b", 1, 128, "bf16", "sgd", **ZEROS),
    {**next(c for c in CASES if c["id"] == "cnn-vgg-cifar-train-fp32-sgd-momentum-b64"),
     "id": "cnn-vgg-cifar-train-fp32-sgd-momentum-zerograd-b64", **ZEROS},
]
CASES += ZERO_GRAD_CASES

for _c in CASES:
    _c.setdefault("tolerance", {"peak": PEAK_TOLERANCE, "states": STATE_TOLERANCE})


def case_by_id() -> dict[str, dict[str, Any]]:
    ids = [c["id"] for c in CASES]
    dupes = {i for i in ids if ids.count(i) > 1}
    if dupes:
        raise ValueError(f"duplicate truth case ids: {sorted(dupes)}")
    return {c["id"]: c for c in CASES}
