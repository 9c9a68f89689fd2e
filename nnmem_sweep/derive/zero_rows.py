"""A scenario's DeepSpeed row as the `measure` case of its rank step (zero_sequence.py traces it): the model's config
(a hand-modelled preset's derived twin, or a derived model's), the batch, sequence, recipe and DeepSpeed settings of
the row; or why no fake run traces it."""
from __future__ import annotations

from typing import Any

from .. import columns as C

# the engine the sequences are traced with (validation/deepspeed-wheels.sh carries the same release to a GPU)
DEEPSPEED_VERSION = "0.19.8"
ENGINE_PRECISION = "bf16-master"  # DeepSpeed's bf16 mode: bf16 parameters and gradients, an fp32 partition


def installed() -> str:
    """The DeepSpeed release importable here ('' where there is none)."""
    from importlib import metadata

    try:
        return metadata.version("deepspeed")
    except metadata.PackageNotFoundError:
        return ""


def row_case(source, row: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:  # noqa: ANN001 - a ModelSource
    """(the measure case of a DeepSpeed row's rank step, without its rank; or None and why it is not traced)."""
    stage = int(row.get(C.ZERO_STAGE, 0))
    if int(row.get(C.REDUCE_BUCKET, 0)) <= 0 or stage < 1:  # zero_stage 0: PyTorch's DDP (parallel/layout.py)
        return None, "not a DeepSpeed layout"
    if stage == 3:
        return None, "ZeRO-3 partitions real tensors only, which no fake run traces"
    if str(row.get(C.PRECISION)) != ENGINE_PRECISION:
        return None, f"DeepSpeed's bf16 engine runs the recipe {ENGINE_PRECISION} alone"
    if str(row.get(C.OFFLOAD, "none")) != "none":
        return None, "an offloaded step: a fake run cannot tell the CPU's storages from the GPU's"
    if source.kind != "hf" or source.preference_json or source.fsdp_json:
        return None, "no DeepSpeed step of this model is traced"
    spec: dict[str, Any] = {"world": int(row[C.DATA_PARALLEL]), "zero_stage": stage,
                            "reduce_bucket_size": int(row[C.REDUCE_BUCKET]),
                            "overlap_comm": bool(row.get(C.OVERLAP_COMM, False))}
    case = {"id": "row", "model": str(source.spec.get("model_type", "")), "hf_config": source.spec, "mode": "train",
            "batch": int(row[C.BATCH]), "seq_len": int(row[C.SEQ_LEN]), "precision": ENGINE_PRECISION,
            "optimizer": str(row[C.OPTIMIZER]), "optimizer_impl": str(row.get(C.OPTIMIZER_IMPL, "foreach")),
            "checkpointing": str(row[C.CHECKPOINTING]), "attention": str(row.get(C.ATTENTION, "flash")),
            "decode_tokens": 0, "deepspeed": spec}
    if source.finetune:
        case["finetune"] = source.finetune
    accum = int(row.get(C.GRADIENT_ACCUMULATION, 1))
    if accum > 1:
        case["gradient_accumulation"] = accum
    return case, ""
