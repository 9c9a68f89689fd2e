"""A scenario's `parallel.deepspeed:` as the parallel axes DeepSpeed's buffers are estimated from (columns
REDUCE_BUCKET, OVERLAP_COMM, PREFETCH_BUCKET; states.deepspeed_buffers): DeepSpeed's defaults (true), a mapping that
overrides them, or a DeepSpeed config JSON whose `zero_optimization` section is read. "auto" values are what
transformers' Trainer puts there (integrations/deepspeed.py HfTrainerDeepSpeedConfig): reduce_bucket_size h·h,
stage3_prefetch_bucket_size 0.9·h·h (h: the model's hidden size)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .. import columns as C
from ..catalog.precisions import Precision
from ..citations import formula, source
from ..paths import read_named_file

# DeepSpeed runtime/zero/config.py defaults
REDUCE_BUCKET_DEFAULT = 500_000_000
ALLGATHER_BUCKET_DEFAULT = 500_000_000
PREFETCH_BUCKET_DEFAULT = 50_000_000
MAX_LIVE_DEFAULT = 1_000_000_000  # stage3_max_live_parameters: gathered parameters ZeRO-3 keeps alive per rank
PERSISTENCE_THRESHOLD_DEFAULT = 100_000  # stage3_param_persistence_threshold: smaller tensors stay whole on each rank
KEYS = ("reduce_bucket_size", "allgather_bucket_size", "stage3_prefetch_bucket_size", "overlap_comm",
        "contiguous_gradients", "offload_optimizer", "offload_param", "stage3_max_live_parameters")


class DeepSpeedConfigError(ValueError):
    """One line: what in the DeepSpeed settings cannot be used."""


def read_config(path: Path) -> dict[str, Any]:
    """The zero_optimization section of a DeepSpeed config JSON (the keys this estimate reads)."""
    try:
        data = json.loads(read_named_file(path, "DeepSpeed config"))
    except json.JSONDecodeError as e:
        raise DeepSpeedConfigError(f"{path}: not JSON ({e.msg}, line {e.lineno})") from None
    zero = data.get("zero_optimization") if isinstance(data, dict) else None
    if not isinstance(zero, dict):
        raise DeepSpeedConfigError(f"{path} has no zero_optimization section: not a DeepSpeed ZeRO config")
    out = {k: zero[k] for k in (*KEYS, "stage") if k in zero}  # the others (persistence, ...) are not read here
    steps = data.get("gradient_accumulation_steps", "auto")  # 'auto': the Trainer's own, the scenario's axis
    if steps != "auto":
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise DeepSpeedConfigError(f"{path}: gradient_accumulation_steps must be a whole number of at least 1 "
                                       f"or 'auto', got {steps!r}")
        out["gradient_accumulation_steps"] = steps
    return out


def _elements(value: Any, key: str, auto: float | None) -> int:
    if value == "auto":
        if auto is None:
            raise DeepSpeedConfigError(f"{key} 'auto' needs the model's hidden size (transformers' Trainer sets it "
                                       "from config.hidden_size); this model has none: give a number")
        return int(auto)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise DeepSpeedConfigError(f"{key} must be a number of elements or 'auto', got {value!r}")
    return int(value)


def axes(settings: dict[str, Any], hidden: int | None) -> dict[str, Any]:
    """The parallel axes (one value each) for DeepSpeed settings (true: {})."""
    unknown = sorted(set(settings) - set(KEYS))
    if unknown:
        raise DeepSpeedConfigError(f"unknown DeepSpeed setting {unknown[0]!r} (read: {', '.join(KEYS)})")
    h2 = hidden * hidden if hidden else None
    reduce = _elements(settings.get("reduce_bucket_size", REDUCE_BUCKET_DEFAULT), "reduce_bucket_size", h2)
    prefetch = _elements(settings.get("stage3_prefetch_bucket_size", PREFETCH_BUCKET_DEFAULT),
                         "stage3_prefetch_bucket_size", 0.9 * h2 if h2 else None)
    _elements(settings.get("allgather_bucket_size", ALLGATHER_BUCKET_DEFAULT), "allgather_bucket_size", h2)
    live = _elements(settings.get("stage3_max_live_parameters", MAX_LIVE_DEFAULT), "stage3_max_live_parameters", None)
    if live > MAX_LIVE_DEFAULT:  # a smaller value releases gathered parameters sooner: 1e9 is its upper bound
        raise DeepSpeedConfigError(f"stage3_max_live_parameters {live:,} is above DeepSpeed's default "
                                   f"{MAX_LIVE_DEFAULT:,}, which ZeRO-3 is planned with (more gathered parameters "
                                   "alive would be missed): give at most 1e9")
    overlap = settings.get("overlap_comm", False)
    contiguous = settings.get("contiguous_gradients", True)
    for key, v in (("overlap_comm", overlap), ("contiguous_gradients", contiguous)):
        if not isinstance(v, bool):
            raise DeepSpeedConfigError(f"{key} must be true or false, got {v!r}")
    # without contiguous_gradients no bucket is made (stage_1_and_2.py setup_buckets, stage3.py __init__)
    out = {C.REDUCE_BUCKET: reduce if contiguous else 0, C.OVERLAP_COMM: bool(overlap), C.PREFETCH_BUCKET: prefetch}
    offload = _offload(settings)
    return {**out, C.OFFLOAD: offload} if offload else out


def _offload(settings: dict[str, Any]) -> str | None:
    """The offload axis a config's offload_optimizer / offload_param devices say (None: neither given): cpu to the
    optimizer's, cpu for both to optimizer+params; NVMe (ZeRO-Infinity's) and parameters alone are not modelled."""
    devices = {}
    for key in ("offload_optimizer", "offload_param"):
        given = settings.get(key)
        if given is None:
            continue
        if not isinstance(given, dict):  # DeepSpeed's config model takes a mapping ({"device": "cpu", ...})
            raise DeepSpeedConfigError(f"{key} must be a mapping such as {{\"device\": \"cpu\"}}, got {given!r}")
        device = given.get("device", "none")
        if device not in ("none", "cpu", "nvme"):
            raise DeepSpeedConfigError(f"{key}.device must be none, cpu or nvme, got {device!r}")
        if device == "nvme":
            raise DeepSpeedConfigError(f"{key} to nvme (ZeRO-Infinity) is not modelled: offload to cpu, or none")
        devices[key] = device
    optimizer, params = devices.get("offload_optimizer", "none"), devices.get("offload_param", "none")
    if params == "cpu" and optimizer != "cpu":
        raise DeepSpeedConfigError("offload_param to cpu without offload_optimizer is not modelled: offload both "
                                   "(optimizer+params) or the optimizer alone")
    if not devices:
        return None
    return "optimizer+params" if params == "cpu" else "optimizer" if optimizer == "cpu" else "none"


def resolve(given: Any, base_dir: Path, hidden: int | None) -> tuple[dict[str, Any], dict[str, tuple[Any, str]]]:
    """`parallel.deepspeed:` (true | mapping | path) as (parallel axes, the run a config JSON says it is); ({}, {})
    for false. The run: zero_optimization.stage and gradient_accumulation_steps (a number, not 'auto') as
    {zero_stage / gradient_accumulation: (value, its name in the config)}, which the scenario's own axes, where it
    gives them, must list (config_blocks._config_run)."""
    if given is False:
        return {}, {}
    if not isinstance(given, str):
        return axes({} if given is True else dict(given), hidden), {}
    settings = read_config(base_dir / given)
    run = {}
    if "gradient_accumulation_steps" in settings:
        run[C.GRADIENT_ACCUMULATION] = (settings.pop("gradient_accumulation_steps"), "gradient_accumulation_steps")
    if "stage" in settings:
        stage = settings.pop("stage")
        if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
            raise DeepSpeedConfigError(f"{given}: zero_optimization.stage must be 0, 1, 2 or 3, got {stage!r}")
        if stage == 3:  # DeepSpeed's default for stage 3 (config.py), false for the others
            settings.setdefault("overlap_comm", True)
        run[C.ZERO_STAGE] = (int(stage), "zero_optimization.stage")
    return axes(settings, hidden), run


DEEPSPEED_ZERO = source("deepspeed-zero", "DeepSpeed runtime/zero: stage_1_and_2.py setup_buckets (with "
                        "contiguous_gradients, a reduce bucket of reduce_bucket_size elements in the 16-bit dtype of "
                        "the parameters, a second one with overlap_comm, made at the backward's first gradient and "
                        "released at its end), stage3.py (parameters gathered module by module, "
                        "stage3_prefetch_bucket_size elements fetched ahead, kept gathered up to "
                        "stage3_max_live_parameters; its reduce bucket measured from the backward to the step on "
                        "0.19.8), config.py (defaults: reduce_bucket_size and allgather_bucket_size 5e8, "
                        "stage3_prefetch_bucket_size 5e7, stage3_max_live_parameters 1e9, contiguous_gradients true, "
                        "overlap_comm true for stage 3 only), utils.py "
                        "all_gather_dp_groups (all_gather_into_tensor into the flat parameters: no allgather bucket)",
                        "https://github.com/deepspeedai/DeepSpeed/tree/master/deepspeed/runtime/zero")


@formula("parallel.deepspeed_offload",
         "ZeRO-Offload (ZeRO-1/2, offload optimizer): GPU: the 16-bit parameters whole, a buffer of T·g (every "
         "phase), and reducing the largest gradient in the backward: 8·min(T, n_z) for its norm (+ T·g, its copy, "
         "where T > R) beside the bucket; ZeRO-1 without overlap_comm holds every gradient G to the backward's end "
         "and reduces them after it, G − R·g of them (+ T_l·g) still held at the first bucket's;  host: M + S + "
         "4·n_z (fp32 gradients) + 2·n_z (the pinned 16-bit copy) + T·g (the pinned gradient buffer) + n_z·g with "
         "gradient accumulation (the micro-batches' gradients; ZeRO-1 keeps them on the GPU)", DEEPSPEED_ZERO,
         where="T = the largest trainable tensor, T_l a decoder layer's, n_z the rank's partition, R = "
               "reduce_bucket_size, g = 2 (bf16); stage_1_and_2.py (0.19.8): temp_grad_buffer_for_gpu_offload and "
               "_for_cpu_offload (largest_param_numel), param_buffer_of_bit16_for_cpu_offload_groups; "
               "copy_grads_in_partition -> set_norm_for_param_grad_in_gpu: the gradient's slice in the partition "
               ".to(fp64).norm(2) on the GPU, before it is copied to the host's fp32 gradient; a tensor larger than R "
               "is reduced alone, as a copy; ZeRO-1's reduce_gradients fills the bucket in the parameters' order, "
               "the embedding first",
         note="Measured on DeepSpeed 0.19.8's engine under FakeTensorMode with the host's storages told apart "
              "(tests/data/truth/deepspeed/*-offload-*): Llama 3.2 1B over 2 ranks at 64 tokens peaks in the backward "
              "at the embedding's fp64 copy, 2,101,346,304 B, beside the bucket and the 525,336,576 B buffer; the "
              "hand model before (ZeRO-Offload's paper: the parameters and the bucket on the GPU) was 5.4-40.4 % low "
              "on Llama 3.2 1B (25.8 % there, 40.4 % at ZeRO-1 over 4 ranks). The CPU step's transients are the "
              "host's and not counted in its bytes")
def deepspeed_offload(lay, prec: Precision, largest: int, n_z: int, grads: int = 0, layer_largest: int = 0
                      ) -> tuple[int, int, int]:
    """(GPU buffer every phase, what reducing the largest gradient adds to the backward's gradients `grads` (bytes
    the rank holds to the backward's end: ZeRO-1's, see keeps_gradients), host bytes beside M + S) of a ZeRO-Offload
    rank (DeepSpeed, ZeRO-1/2, offload optimizer), `largest` trainable elements in one tensor, `layer_largest` in a
    decoder layer's; zeros for any other layout."""
    if not zero_offload(lay):
        return 0, 0, 0
    g = prec.weight_bytes  # the bf16 engine's gradients
    buffer = largest * g
    reduce = 8 * min(largest, n_z) + (largest * g if largest > lay.reduce_bucket else 0)
    if offload_keeps_gradients(lay):  # the rest held beside the full bucket, in place of all of them
        bucket = lay.reduce_bucket * g
        reduce += max(grads - bucket, 0) + (layer_largest * g if grads > bucket else 0) - grads
    # accumulated_grads_in_cpu: the partition's, 16-bit (ZeRO-1 without overlap_comm accumulates on the GPU)
    accumulated = n_z * g if lay.accum > 1 and not offload_keeps_gradients(lay) else 0
    return buffer, reduce, (4 + g) * n_z + buffer + accumulated


def zero_offload(lay) -> bool:
    """DeepSpeed's ZeRO-Offload as measured: offload optimizer at ZeRO-1 or 2 (ZeRO-3's keeps the paper's
    accounting)."""
    return lay.deepspeed and lay.offload == "optimizer" and lay.zero in (1, 2)


def offload_keeps_gradients(lay) -> bool:
    """ZeRO-Offload at stage 1 without overlap_comm: every gradient held to the backward's end, reduced after it."""
    return zero_offload(lay) and lay.zero == 1 and not lay.overlap_comm
