"""`parallel: {accelerate: accelerate_config.yaml}`: the run a Hugging Face accelerate config file describes (what
`accelerate config` writes and `accelerate launch --config_file` reads), as the parallel axes it sets.

Read, as accelerate's FullyShardedDataParallelPlugin reads them (accelerate main, utils/dataclasses.py and
utils/constants.py):
- `distributed_type`: FSDP (sharded over `num_processes` ranks), or MULTI_GPU (DistributedDataParallel over them);
  DEEPSPEED is refused with the way to give its DeepSpeed config (parallel.deepspeed);
- `num_processes`: every process of the run, over all machines: data_parallel;
- `fsdp_config.fsdp_version`: 1 (accelerate's default, FullyShardedDataParallel) or 2 (fully_shard);
- FSDP1's `fsdp_sharding_strategy` (a name or its number 1-5; else `fsdp_reshard_after_forward` as a name), FULL_SHARD
  by default; FSDP2's `fsdp_reshard_after_forward` (true by default): FULL_SHARD / true is zero_stage 3,
  SHARD_GRAD_OP / false zero_stage 2; NO_SHARD and the hybrid strategies are not modelled;
- `fsdp_config.fsdp_offload_params`: offload optimizer+params (FSDP's CPU offload) or none;
- `fsdp_config.fsdp_auto_wrap_policy`: TRANSFORMER_BASED_WRAP (a unit per decoder block, as planned) or absent;
  SIZE_BASED_WRAP and NO_WRAP make other units and are refused.
- FSDP1's `fsdp_config.fsdp_backward_prefetch` (or the older `fsdp_backward_prefetch_policy`, which accelerate's
  launcher takes for it): BACKWARD_PRE is backward_prefetch pre, NO_PREFETCH and no key at all (the plugin's default,
  None) none; BACKWARD_POST is not modelled. FSDP2 takes none (accelerate ignores it there).
`fsdp_config.fsdp_activation_checkpointing` is returned beside the axes (the grid's checkpointing must then list
full: config_blocks.check_parallel). Not read: `mixed_precision` (the scenario's precision axis says the dtypes).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from .. import columns as C
from ..paths import read_named_file

STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2")  # accelerate's order
STAGE_OF = {"FULL_SHARD": 3, "SHARD_GRAD_OP": 2}
WRAPS = ("TRANSFORMER_BASED_WRAP",)
PREFETCHES = ("BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH")
PREFETCH_OF = {"BACKWARD_PRE": "pre", "NO_PREFETCH": "none"}


class AccelerateConfigError(ValueError):
    """A one-line reason an accelerate config cannot be planned."""


def _bool(value: Any, key: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise AccelerateConfigError(f"{key} must be true or false, got {value!r}")


def _strategy(fsdp: dict[str, Any], version: int) -> int:
    """zero_stage of the config's sharding strategy (module docstring)."""
    if version == 2:
        if "fsdp_sharding_strategy" in fsdp:
            raise AccelerateConfigError("fsdp_sharding_strategy is FSDP1's; FSDP2 (fsdp_version 2) takes "
                                        "fsdp_reshard_after_forward: true (FULL_SHARD) or false (SHARD_GRAD_OP)")
        return 3 if _bool(fsdp.get("fsdp_reshard_after_forward", True), "fsdp_reshard_after_forward") else 2
    key = "fsdp_sharding_strategy" if "fsdp_sharding_strategy" in fsdp else "fsdp_reshard_after_forward"
    given = fsdp.get(key, "FULL_SHARD")
    text = str(given).upper()
    name = STRATEGIES[int(text) - 1] if text.isdigit() and 1 <= int(text) <= len(STRATEGIES) else text
    if name not in STRATEGIES or isinstance(given, bool):
        raise AccelerateConfigError(f"{key} must be one of {', '.join(STRATEGIES)} (or 1-5), got {given!r}")
    if name not in STAGE_OF:
        raise AccelerateConfigError(f"{key} {name} is not modelled: FULL_SHARD (zero_stage 3) or SHARD_GRAD_OP "
                                    "(zero_stage 2)")
    return STAGE_OF[name]


def _prefetch(fsdp: dict[str, Any]) -> str:
    """backward_prefetch of FSDP1's config (module docstring): pre or none."""
    keys = [k for k in ("fsdp_backward_prefetch", "fsdp_backward_prefetch_policy") if fsdp.get(k) is not None]
    if not keys:
        return "none"  # the plugin's default: backward_prefetch None
    given = str(fsdp[keys[0]]).upper()
    if given not in PREFETCHES:
        raise AccelerateConfigError(f"{keys[0]} must be one of {', '.join(PREFETCHES)}, got {fsdp[keys[0]]!r}")
    if given not in PREFETCH_OF:
        raise AccelerateConfigError(f"{keys[0]} {given} is not modelled: BACKWARD_PRE or NO_PREFETCH")
    return PREFETCH_OF[given]


def read(path: Path) -> tuple[dict[str, tuple[Any, str]], bool]:
    """(the run the accelerate config at `path` says: {parallel axis: (its value, how the refusal names it)};
    whether it checkpoints)."""
    try:
        data = yaml.safe_load(read_named_file(path, "accelerate config"))
    except yaml.YAMLError as e:
        raise AccelerateConfigError(f"{path}: not YAML ({getattr(e, 'problem', None) or e})") from None
    if not isinstance(data, dict) or "distributed_type" not in data:
        raise AccelerateConfigError(f"{path} has no distributed_type: not an accelerate config")
    kind = str(data["distributed_type"]).upper()
    if kind == "DEEPSPEED":
        given = (data.get("deepspeed_config") or {}).get("deepspeed_config_file")
        raise AccelerateConfigError("distributed_type DEEPSPEED: give its DeepSpeed config as parallel.deepspeed"
                                    + (f" ({given})" if given else ""))
    if kind not in ("FSDP", "MULTI_GPU"):
        raise AccelerateConfigError(f"distributed_type {kind} is not modelled: FSDP or MULTI_GPU")
    ranks = data.get("num_processes")
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 2:
        raise AccelerateConfigError(f"num_processes must be a whole number of at least 2 for {kind}, got {ranks!r}")
    if kind == "MULTI_GPU":  # DistributedDataParallel: every rank the whole model
        return _named({C.DATA_PARALLEL: ranks, C.ZERO_STAGE: 0}), False
    fsdp = data.get("fsdp_config") or {}
    if not isinstance(fsdp, dict):
        raise AccelerateConfigError(f"fsdp_config must be a mapping, got {fsdp!r}")
    version = fsdp.get("fsdp_version", 1)
    if isinstance(version, str) and version.isdigit():
        version = int(version)
    if version not in (1, 2) or isinstance(version, bool):
        raise AccelerateConfigError(f"fsdp_version must be 1 or 2, got {version!r}")
    wrap = fsdp.get("fsdp_auto_wrap_policy")
    if wrap is not None and str(wrap).upper() not in WRAPS:
        raise AccelerateConfigError(f"fsdp_auto_wrap_policy {wrap} makes other units than the decoder blocks, which "
                                    "are planned: TRANSFORMER_BASED_WRAP")
    offload = _bool(fsdp.get("fsdp_offload_params", False), "fsdp_offload_params")
    axes = {C.DATA_PARALLEL: ranks, C.ZERO_STAGE: _strategy(fsdp, version), C.FSDP_VERSION: version,
            C.OFFLOAD: C.OFFLOAD_PARAMS if offload else "none"}
    if version == 1:
        axes[C.BACKWARD_PREFETCH] = _prefetch(fsdp)
    return _named(axes), _bool(fsdp.get("fsdp_activation_checkpointing", False), "fsdp_activation_checkpointing")


def _named(axes: dict[str, Any]) -> dict[str, tuple[Any, str]]:
    return {axis: (value, f"its {axis}") for axis, value in axes.items()}
