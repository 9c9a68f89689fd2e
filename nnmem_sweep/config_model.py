"""The semantic checks of the blocks that change the model a scenario plans (config.py assembles them, after
config_blocks.py's): which model, and what is planned from its own code.

    check_model       model:       a preset, a config.json, explicit fields or a layer list (models/resolve.py); a
                                   `runtime:` naming other transformers / peft releases plans it from their code
                                   (derive/side.py)
    check_derived     (model)      what a model planned from its own code is not planned for, refused where written
    check_finetune    finetune:    LoRA / QLoRA adapters (components/finetune.py), folded into the model
    check_preference  preference:  DPO / SimPO / ORPO steps (workload/preference.py), folded into the model
"""
from __future__ import annotations

import dataclasses
from typing import Any

from . import columns as C
from .components import finetune as F
from .components import finetune_method as FM
from .components.finetune_method import parse_finetune
from .config_blocks import accumulation_only, sharding_axes
from .config_check import Checker
from .config_yaml import join
from .derive import DerivationError
from .derive.arch import architecture_of, derived_twin, peft_spec, with_adapters, with_preference
from .derive.side import NotPrepared, stated
from .errors import ScenarioError, UsageError
from .estimate import offload_twin
from .models.resolve import DerivedModelSpec, ModelSpecError, resolve_model
from .parallel import layout as L
from .workload import preference


def check_model(data: dict, ck: Checker):
    spec = data.get("model")
    if not isinstance(spec, dict) or not ck.clean("model"):
        return None
    stack = stated(data.get("runtime")) if ck.clean("runtime") else {}  # derive/side.py
    if stack and any(k in spec for k in ("preset", "hf_config")) and "derive" not in spec:
        # a hand model is checked against the installed releases: another release's code is traced instead
        spec = {**spec, "derive": True}
    try:
        model = resolve_model(spec, ck.base_dir)
        if isinstance(model, DerivedModelSpec):  # planned from its own code: the model is built (or its card read)
            try:
                return architecture_of(model, stack)
            except NotPrepared as e:  # the releases runtime: names, not the model, are what is missing
                ck.add(f"runtime.{next(iter(stack))}", str(e))
                return None
            except DerivationError as e:
                where = f"{model.origin}: " if model.key_path == "model.hf_config" else ""
                ck.add(model.key_path, f"{where}{e}")
                return None
        return model
    except ModelSpecError as e:
        key = e.key_path or "model"
        ck.add(key if key == "model" or key.startswith(("model.", "model[")) else join("model", key),
               getattr(e, "message", str(e)))
    except ValueError as e:
        ck.add("model", str(e))
    return None


def needs_no_sequence(model) -> bool:
    """Layer-list nets, per-sample params models and derived models without a sequence axis (image classifiers,
    `module:` factories) have no sequence axis: seq_len defaults to 1."""
    if model.kind == "derived":
        return not model.derived.source.sequence
    return model.kind == "layers" or (model.kind == "params" and not model.activation_elements_per_token)


def check_derived(data: dict, mode: str, model, grid: dict[str, tuple[Any, ...]], parallel: dict, ck: Checker) -> None:
    """What a model planned from its own code (derive/) is not planned for, each refused where it is written."""
    if model is None or model.kind != "derived":
        return
    what = f"{model.name} is planned from its own code"
    refused = _offload_refused(data, parallel, ck)
    if not refused and parallel and not accumulation_only(parallel) and not L.fsdp_only(parallel):
        where = "parallel" if isinstance(data.get("parallel"), dict) else \
            f"grid.{next(a for a in (data.get('grid') or {}) if a in C.PARALLEL_AXES)}"
        ck.add(where, f"parallel layouts ({', '.join(sharding_axes(parallel))}) are modelled for hand-modelled "
                      f"families; {what}: on one GPU, with gradient accumulation, or over data_parallel ranks "
                      "sharded as FSDP shards them (zero_stage 2 or 3, with or without accumulation)", key=True)
    if isinstance(data.get("cluster"), dict):
        ck.add("cluster", f"the cluster search needs parallel layouts, modelled for hand-modelled families; {what}",
               key=True)
    if any(int(v) > 0 for v in grid.get(C.CACHE_TOKENS, ())):
        ck.add("grid.cache_tokens", f"a preallocated cache is modelled for hand-modelled families; {what}, which "
                                    "runs generate()'s dynamic cache (leave cache_tokens at 0)")
    if "selective" in grid.get(C.CHECKPOINTING, ()):
        ck.add("grid.checkpointing", "'selective' is Megatron's recipe (recompute attention only); a model planned "
                                     "from its transformers code checkpoints whole layers: use none or full")
    if mode == "infer" and model.derived.source.spec.get("is_encoder_decoder"):
        ck.add("mode", f"an encoder-decoder's generation is measured (`nnmem-sweep measure`) but not derived: its "
                       f"decoder cache grows with the generated tokens; training is derived ({model.name})")


def check_finetune(data: dict, mode: str, model, parallel: dict, ck: Checker):
    """The `finetune:` block (components/finetune.py) folded into the model, so every estimator path sees it."""
    if "finetune" not in data or not ck.clean("finetune"):
        return model
    try:
        ft = parse_finetune(data["finetune"], lambda p: (ck.b.file, *(ck.b.locate(p) or (None, None))))
    except ScenarioError as e:
        for p in e.problems:
            ck.add(p.key_path, p.message)
        return model
    if not ft.adapters or model is None:
        return model
    if mode != "train":
        ck.add("finetune", "fine-tuning applies to train mode only (this scenario has mode: infer)", key=True)
        return model
    deepspeed = L.deepspeed_dp_only(parallel)
    if not L.deepspeed_layouts(parallel) and _offload_refused(data, parallel, ck):
        return model
    problem = L.deepspeed_offload_problem(parallel) if L.deepspeed_layouts(parallel) else None
    if problem:
        ck.add(_offload_key(data), problem)
        return model
    if parallel and not accumulation_only(parallel) and not L.fsdp_only(parallel) and not deepspeed:
        ck.add("finetune", f"finetune method {ft.method} is modelled on one GPU, with gradient accumulation, "
                           "sharded as FSDP shards it over data_parallel ranks (zero_stage 2 or 3), or under "
                           "DeepSpeed ZeRO-1, 2 or 3 over data_parallel ranks (parallel.deepspeed): "
                           f"{_off_adapter_layouts(parallel)} not modelled for adapters yet", key=True)
        return model
    if deepspeed:
        return _under_deepspeed(data, model, ft, ck)
    sharded = bool(parallel) and L.fsdp_only(parallel) and not accumulation_only(parallel)
    if FM.hand_modelled(model, ft) and not sharded:  # sharded: its rank's step traced (the derived twin)
        return _with_hand_adapters(model, ft, ck)
    # every other model (and modules_to_save): planned from its own code with peft's adapters on it
    base = derived_twin(model, allow_deriving=True) if model.kind != "derived" else model
    if base is None:
        ck.add("finetune", f"finetune {ft.method} of {model.name}: it has no hand model of its adapters and cannot be "
                           "planned from its own code (give it as a preset, hf_config or module)", key=True)
        return model
    try:
        return with_adapters(base, ft, peft_spec(ft))
    except DerivationError as e:
        ck.add("finetune", f"finetune {ft.method} of {model.name}: {e}", key=True)
        return model


def check_offloaded_ranks(data: dict, mode: str, model, parallel: dict, ck: Checker):
    """A hand-modelled transformer's full fine-tune offloaded by FSDP (offload optimizer+params; FSDP1's CPUOffload,
    FSDP2's CPUOffloadPolicy): planned from its own code, its rank's step traced with the host told apart
    (derive/step.py), as its adapters are; the hand model of ZeRO-Offload holds what DeepSpeed's engine holds, not
    FSDP (Llama 3.2 1B over 2 ranks, FSDP1 FULL_SHARD, 2 x 1,024: 5.5 % above the measured GPU side,
    tests/data/truth/sharded/*-offload-*)."""
    if model is None or model.kind != "transformer" or mode != "train":
        return model
    if "cluster" in data:  # the cluster search keeps the hand model, which FSDP's SHARD_GRAD_OP offload is not
        if parallel and 2 in {int(z) for z in parallel.get(C.ZERO_STAGE, ())} and not L.deepspeed_layouts(parallel) \
                and C.OFFLOAD_PARAMS in {str(v) for v in parallel.get(C.OFFLOAD, ())}:
            ck.add(_offload_key(data), "offload optimizer+params at zero_stage 2 (FSDP's CPU offload under "
                                       "SHARD_GRAD_OP) is planned from the rank's traced step, which a scenario with "
                                       "a cluster: search does not take: zero_stage 3, or no cluster:")
        return model
    if L.fsdp_versions(parallel or {}) == {1} and _offload_refused(data, parallel, ck):
        return model  # FSDP1 named: its offload as FSDP1 runs it, or refused (accumulation, ZeRO-Offload's names)
    if not L.fsdp_offloads(parallel):
        return model
    try:
        return offload_twin(model)
    except UsageError as e:
        ck.add(_offload_key(data), str(e))
        return model


def _offload_refused(data: dict, parallel: dict, ck: Checker) -> bool:
    """An offload a model planned from its own code (or adapters, through it) is not traced with, refused at the
    offload key (parallel/layout.py fsdp_offload_problem); False where there is none."""
    problem = L.fsdp_offload_problem(parallel) if parallel else None
    if problem is None:
        return False
    where = _offload_key(data)
    if ck.clean(where):  # once (the adapters' check and the derived model's both ask)
        ck.add(where, problem)
    return True


def _offload_key(data: dict) -> str:
    """Where a scenario gives its offload: parallel.offload, or the grid's axis."""
    block = data.get("parallel") if isinstance(data.get("parallel"), dict) else {}
    return f"parallel.{C.OFFLOAD}" if C.OFFLOAD in block else f"grid.{C.OFFLOAD}"


def _off_adapter_layouts(parallel: dict) -> str:
    """What takes a layout off those adapters are planned for, in words, with its verb (the refusal's): under
    DeepSpeed any axis but data_parallel, zero_stage and its buffers (accumulation too); else any but FSDP's
    (data_parallel, zero_stage 2 or 3, accumulation and its sync)."""
    deepspeed = L.deepspeed_layouts(parallel)
    allowed = L.DEEPSPEED_AXES if deepspeed else L.FSDP_AXES
    off = [a for a, vs in parallel.items() if a not in (C.DATA_PARALLEL, C.ZERO_STAGE, *allowed)
           and any(v != C.PARALLEL_DEFAULTS[a] for v in vs)]
    if not deepspeed and 1 in {int(z) for z in parallel.get(C.ZERO_STAGE, ())}:
        off.append("zero_stage 1 (FSDP shards the gradients with the optimizer state: 2 or 3)")
    named = off or sharding_axes(parallel)
    return f"{', '.join(named)}{' with parallel.deepspeed' if deepspeed and off else ''} " \
        f"{'is' if len(named) == 1 else 'are'}"


def _under_deepspeed(data: dict, model, ft, ck: Checker):
    """LoRA under DeepSpeed's engine (ZeRO-1/2/3 over data-parallel ranks, parallel/states.py _adapter_states): the
    hand model of the adapters, which the bf16 engine casts to the model's dtype."""
    if not FM.hand_modelled(model, ft):
        ck.add("finetune", f"finetune {ft.method} under DeepSpeed is modelled for LoRA on the hand-modelled families "
                           f"({', '.join(FM.LORA_FAMILIES)}); {model.name} is planned from its own code, which is "
                           "traced sharded as FSDP shards it (zero_stage 2 or 3 without parallel.deepspeed)", key=True)
        return model
    given = data["finetune"].get("adapter_dtype") if isinstance(data["finetune"], dict) else None
    if given == "fp32":
        ck.add("finetune.adapter_dtype", "DeepSpeed's bf16 engine casts the whole model to the model's dtype, the "
                                         "adapters too: adapter_dtype fp32 does not run under it (use model)")
        return model
    return _with_hand_adapters(model, dataclasses.replace(ft, adapter_dtype="model"), ck)


def _with_hand_adapters(model, ft, ck: Checker):
    """The model with the hand model's adapters on it (components/finetune.py); targets the family lacks are one
    line, at finetune.targets where the scenario gives them."""
    try:
        F.adapter_params(model, ft)
    except (UsageError, ValueError) as e:
        ck.add("finetune.targets" if "target" in str(e) and ck.b.locate("finetune.targets") else "finetune",
               str(e), key=True)
        return model
    return dataclasses.replace(model, finetune=ft)


def check_preference(data: dict, mode: str, model, ck: Checker):
    """The `preference:` block (workload/preference.py): the model, planned from its own code (its derived twin for
    a hand-modelled preset, with the adapters of `finetune:` on it), trained on preference pairs."""
    given = data.get("preference")
    if not isinstance(given, dict) or not ck.clean("preference") or model is None:
        return model
    if mode != "train":
        ck.add("preference", "preference tuning applies to train mode only (this scenario has mode: infer)", key=True)
        return model
    lora = model.finetune is not None and model.finetune.adapters
    spec = {"loss": given["loss"]}
    if given["loss"] == "dpo":
        spec["reference"] = given.get("reference") or ("adapters" if lora else "model")
    try:
        preference.check({**given, **spec} if given["loss"] == "dpo" else given, lora)
    except ValueError as e:
        ck.add("preference.reference" if "reference" in given else "preference", str(e), key=True)
        return model
    base = model if model.kind == "derived" else derived_twin(model, allow_deriving=True)
    if base is None:
        ck.add("preference", f"preference tuning of {model.name} is planned from its own code, which it does not have "
                             "(give it as a preset, hf_config or module)", key=True)
        return model
    try:
        return with_preference(base, spec)
    except DerivationError as e:
        ck.add("preference", f"preference tuning of {model.name}: {e}", key=True)
        return model
