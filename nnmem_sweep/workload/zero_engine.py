"""One rank of a DeepSpeed ZeRO training step, as DeepSpeed's own engine runs it (issue 22): the model and a
torch optimizer handed to deepspeed.initialize() with bf16 on, on one rank (0, or the spec's `rank`) of PyTorch's
fake process group (workload/fsdp.py fake_process_group; DeepSpeed's comm layer on its "fake" backend), so under
FakeTensorMode one rank of a billion-parameter model costs nothing and the collectives move nothing.

What DeepSpeed then holds is its own: the 16-bit parameters flattened into one buffer per group (the model's
tensors become views of it), the rank's fp32 partition of them (the master weights the optimizer steps), the
optimizer's state over that partition, the reduce bucket(s) of `reduce_bucket_size` elements through the backward,
the rank's gradient partition from the end of the backward to the step, and the step's fp32 copy of it.

One accommodation of fake tensors, stated where the truth is written: a FakeTensor holds no values, so DeepSpeed's
overflow check (which runs as it does, allocating what it allocates) is answered "finite"; a bf16 run's check
answers the same for finite gradients. ZeRO-3 (stage3.py) does not run under FakeTensorMode in DeepSpeed 0.19.8
("Detected a disagreement on list length" while partitioning): it runs with real tensors on the CPU, rank 0 holding
its partition only (a 1B model's ZeRO-3 rank fits this machine's memory; an 8B one does not).

ZeRO-Offload (`offload: optimizer`, ZeRO-1/2) runs as DeepSpeed runs it, its pinned host buffers included, with
torch's optimizer stepping the host partition (host_side tells the host's storages apart: one device holds both).
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

STAGES = (1, 2, 3)
# rank: the rank this process is (0 by default): ZeRO-1/2's partitions differ from rank to rank; offload: "optimizer"
# for ZeRO-Offload (offload_optimizer to the CPU, ZeRO-1/2), "none" by default
KEYS = ("world", "zero_stage", "reduce_bucket_size", "overlap_comm", "contiguous_gradients", "rank", "offload")
OFFLOADS = ("none", "optimizer")


def check(spec: dict[str, Any]) -> tuple[int, int]:
    unknown = sorted(set(spec) - set(KEYS))
    if unknown:
        raise ValueError(f"deepspeed: unknown setting {unknown[0]!r} (read: {', '.join(KEYS)})")
    world, stage = int(spec.get("world", 0)), int(spec.get("zero_stage", 2))
    if world < 2:
        raise ValueError(f"deepspeed: world must be at least 2, got {world}")
    if stage not in STAGES:
        raise ValueError(f"deepspeed: zero_stage must be 1, 2 or 3, got {stage}")
    if not 0 <= int(spec.get("rank", 0)) < world:
        raise ValueError(f"deepspeed: rank must be in 0..{world - 1}, got {spec['rank']}")
    if spec.get("offload", "none") not in OFFLOADS:
        raise ValueError(f"deepspeed: offload must be one of {', '.join(OFFLOADS)}, got {spec['offload']!r}")
    return world, stage


def offloads(spec: dict[str, Any]) -> bool:
    """Whether the spec runs ZeRO-Offload: the optimizer's partition (fp32 master, state, gradients) on the CPU."""
    return spec.get("offload", "none") == "optimizer"


def ds_config(spec: dict[str, Any], batch: int, accum: int = 1) -> dict[str, Any]:
    """The ds_config of `spec`: bf16, the stage and the bucket settings given (DeepSpeed's defaults otherwise)."""
    zero: dict[str, Any] = {"stage": int(spec.get("zero_stage", 2))}
    for key in ("reduce_bucket_size", "overlap_comm", "contiguous_gradients"):
        if key in spec:
            zero[key] = spec[key]
    out = {"train_micro_batch_size_per_gpu": batch, "gradient_accumulation_steps": accum, "bf16": {"enabled": True},
           "zero_optimization": zero, "zero_allow_untested_optimizer": True, "steps_per_print": 1 << 30}
    if offloads(spec):
        # ZeRO-Offload with pinned host buffers (DeepSpeed's default); torch's optimizer steps the host partition,
        # where DeepSpeedCPUAdam (a compiled op) would: the step runs on the CPU either way, so the GPU's bytes are
        # the same (zero_force_ds_cpu_optimizer False lets DeepSpeed take it)
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        out["zero_force_ds_cpu_optimizer"] = False
    return out


@contextlib.contextmanager
def comm(world: int, rank: int = 0) -> Iterator[None]:
    """PyTorch's fake process group of `world` ranks with DeepSpeed's comm layer on it, this process `rank` (its
    partitions are that rank's: ZeRO-1/2 cut one flat buffer, rank 0 the start, the last rank the end)."""
    import os

    from .fsdp import fake_process_group

    env = {"RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": "29533"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        with fake_process_group(world, rank):
            import deepspeed

            deepspeed.init_distributed(dist_backend="fake")
            yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def rank_comm(spec: dict[str, Any]):  # noqa: ANN201 - comm's context manager
    """comm() for the rank a spec names (`rank`, 0 by default) over its `world`."""
    return comm(check(spec)[0], int(spec.get("rank", 0)))


def initialize(model: torch.nn.Module, optimizer: torch.optim.Optimizer, spec: dict[str, Any], batch: int,
               fake: bool, accum: int = 1):
    """(engine, ZeRO optimizer) for `model` (call inside comm(world) and, when fake, the FakeTensorMode); `accum`
    micro-batches per optimizer step (gradient_accumulation_steps: engine.step() steps at the last)."""
    import deepspeed

    from .build import replacing_module_to

    check(spec)
    with replacing_module_to() if fake else contextlib.nullcontext():
        engine, zero, _, _ = deepspeed.initialize(model=model, optimizer=optimizer,
                                                  config=ds_config(spec, batch, accum))
    return engine, zero


@contextlib.contextmanager
def answered_finite(zero) -> Iterator[None]:  # noqa: ANN001
    """Module docstring: under FakeTensorMode, DeepSpeed's overflow check and its norm check run as they do (what
    they allocate is recorded) and are answered "finite", what a real bf16 step with finite gradients answers."""
    import deepspeed.runtime.zero.stage3 as S3
    import deepspeed.runtime.zero.stage_1_and_2 as S12

    check_overflow, check_norm = zero.has_overflow, S12.is_invalid_grad_norm
    check_tensor = S12.has_inf_or_nan  # (ZeRO-Offload's check of each gradient as it goes to the host)

    def has_overflow(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        check_overflow(*args, **kwargs)
        return False

    def has_inf_or_nan(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        check_tensor(*args, **kwargs)
        return False

    def is_invalid_grad_norm(norm):  # noqa: ANN001, ANN202
        if isinstance(norm, torch.Tensor):
            (~torch.isfinite(norm) | (norm < 0)).any()
        return False

    # a GPU run's collectives on the fake process group move nothing either: a gathered partition holds whatever
    # the block held before (measure/real.py), so ZeRO-3's check is answered the same
    zero.has_overflow, S12.is_invalid_grad_norm, S3.is_invalid_grad_norm, S12.has_inf_or_nan = \
        has_overflow, is_invalid_grad_norm, is_invalid_grad_norm, has_inf_or_nan
    try:
        yield
    finally:
        zero.has_overflow, S12.is_invalid_grad_norm, S3.is_invalid_grad_norm, S12.has_inf_or_nan = \
            check_overflow, check_norm, check_norm, check_tensor


def held_tensors(engine, zero, optimizer: torch.optim.Optimizer) -> dict[str, list[torch.Tensor]]:  # noqa: ANN001
    """What a rank holds between steps, by kind: the model's parameters (ZeRO-1/2: views of DeepSpeed's flat 16-bit
    buffers; ZeRO-3: the persistent ones whole, the others' partitions in its flat 16-bit groups or, frozen, each in its
    own ds_tensor) and buffers, the fp32 partitions (master weights) and the optimizer's state over them (ZeRO-Offload:
    on the host, host_tensors); ZeRO-3 also its 16-bit gradient partition and reduce bucket, which it keeps from one
    step to the next, and ZeRO-Offload its GPU buffer of the largest trainable tensor's 16-bit gradient ("grad",
    made at initialisation, used where micro-batches accumulate)."""
    stage3 = hasattr(zero, "fp32_partitioned_groups_flat")
    params = list(engine.module.parameters())
    if stage3:  # the trainable partitions in the flat groups; a frozen parameter's (LoRA's base) its own ds_tensor
        params += list(zero.fp16_partitioned_groups_flat) + [getattr(p, "ds_tensor", None) for p in params]
    master = zero.fp32_partitioned_groups_flat if stage3 else zero.single_partition_of_fp32_groups
    held = {"param": [p for p in params if isinstance(p, torch.Tensor)], "buffer": list(engine.module.buffers()),
            "master": [t for t in master if isinstance(t, torch.Tensor)],
            "opt": _state_tensors(optimizer)}
    if stage3:  # kept from one step to the next: the 16-bit gradient partition and the reduce bucket (stage3.py)
        kept = [getattr(zero, "grad_partitions_flat_buffer", None)]
        kept += [getattr(b, "buffer", None) for b in getattr(zero, "ipg_buckets", {}).values()]
        held["grad"] = [t for t in kept if isinstance(t, torch.Tensor)]
    elif getattr(zero, "cpu_offload", False):  # ZeRO-Offload's GPU buffer of the largest trainable tensor's gradient
        held["grad"] = [zero.temp_grad_buffer_for_gpu_offload]
    return held


def _state_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The tensors of the optimizer's state (AdamW's moments and step counters)."""
    return [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]


def host_tensors(zero, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:  # noqa: ANN001
    """What a ZeRO-Offload rank keeps in host memory (stage_1_and_2.py with cpu_offload, DeepSpeed 0.19.8): the fp32
    partition and its fp32 gradient, the pinned 16-bit copy of the partition the GPU's parameters are refreshed
    from, the pinned gradient buffer, the micro-batches' accumulated gradients (accumulation) and the optimizer's
    state; none without offload."""
    if not getattr(zero, "cpu_offload", False):
        return []
    out = list(zero.single_partition_of_fp32_groups)
    out += [t.grad for t in zero.single_partition_of_fp32_groups if t.grad is not None]
    out += list(zero.param_buffer_of_bit16_for_cpu_offload_groups)
    out += [zero.temp_grad_buffer_for_cpu_offload, *zero.accumulated_grads_in_cpu.values()]
    out += _state_tensors(optimizer)
    return [t for t in out if isinstance(t, torch.Tensor)]


@contextlib.contextmanager
def host_side(zero, optimizer: torch.optim.Optimizer, rec) -> Iterator[None]:  # noqa: ANN001
    """A ZeRO-Offload rank's host work told apart in the Recorder `rec` (derive/trace.py): its host storages
    (host_tensors) are never events, nor is what the torch optimizer's step (the CPU step) or the accumulation of a
    micro-batch's gradients into their host buffers (async_accumulate_grad_in_cpu_via_gpu) makes; nothing without
    offload."""
    if not getattr(zero, "cpu_offload", False):
        yield
        return
    rec.host_storages(host_tensors(zero, optimizer))
    stack = contextlib.ExitStack()
    pre = optimizer.register_step_pre_hook(lambda *_: stack.enter_context(rec.on_host()))
    post = optimizer.register_step_post_hook(lambda *_: stack.close())
    accumulate = zero.async_accumulate_grad_in_cpu_via_gpu

    def on_host_accumulate(param):  # noqa: ANN001, ANN202
        with rec.on_host():
            return accumulate(param)

    zero.async_accumulate_grad_in_cpu_via_gpu = on_host_accumulate
    try:
        yield
    finally:
        pre.remove()
        post.remove()
        stack.close()
        zero.async_accumulate_grad_in_cpu_via_gpu = accumulate
        rec.host_storages(host_tensors(zero, optimizer))  # what the host made meanwhile (a fresh run's state)


class EngineOptimizer:
    """What run_steps (workload/steps.py) steps for a DeepSpeed workload: the engine's step(), which zeroes the
    gradients itself; the torch optimizer (its state, for the totals) and the ZeRO optimizer (answered_finite,
    held_tensors)."""

    def __init__(self, engine, optimizer: torch.optim.Optimizer, zero) -> None:  # noqa: ANN001
        self.engine, self.optimizer, self.zero = engine, optimizer, zero

    @property
    def state(self):  # noqa: ANN201 - the torch optimizer's
        return self.optimizer.state

    def step(self) -> None:
        self.engine.step()

    def zero_grad(self, set_to_none: bool = True) -> None:  # noqa: ARG002 - engine.step() zeroed them
        return None


def destroy(w) -> None:  # noqa: ANN001 - a Workload engine_workload made
    """Let go what DeepSpeed lets go of a workload's engine, model and optimizer, at the end of a run. Without it
    they outlive every reference: the ZeRO optimizer's gradient hooks hold them from autograd's C++ nodes, where no
    collection reaches (engine.destroy() removes them), and ZeRO-3 appends the model to DeepSpeed's module-level
    FWD_MODULE_STACK at initialisation and never takes it off (deepspeed/runtime/zero/parameter_offload.py, 0.19.8).
    ZeRO-3 still keeps its engine (a class-level lru_cache of its parameter coordinator holds it), so the GPU kit
    runs each capped run of a DeepSpeed point in a process of its own (measure/kit.py fresh_probe): on its first
    DeepSpeed run (H100, 2026-11-27) every capped run of one process started on top of the runs before it."""
    from deepspeed.runtime.zero import parameter_offload

    engine = w.optimizer.engine
    engine.destroy()
    stack = parameter_offload.FWD_MODULE_STACK
    stack[:] = [m for m in stack if m is not engine.module]


def engine_workload(case: dict[str, Any], cfg: dict[str, Any], fake: bool = False):  # noqa: ANN201 - a Workload
    """One rank of DeepSpeed's engine for `case`, inside comm(world) (and FakeTensorMode when fake: the truth,
    measure/zero_step.py; the device's context for the GPU kit, measure/real.py): the model built in bf16
    (DeepSpeed's bf16 mode; the case's recipe, bf16-master, names the fp32 partition and state it keeps), its
    workload with the engine as the model, its backward, and its step over the case's micro-batches."""
    from .build import build_model, build_optimizer, default_dtype, make_workload

    plain = {**{k: v for k, v in case.items() if k != "deepspeed"}, "precision": "bf16"}
    with default_dtype(torch.bfloat16):
        model = build_model(plain, cfg, fake)
        w = make_workload(plain, cfg, model, None)
    optimizer = build_optimizer(model, case["optimizer"], case.get("optimizer_impl", "foreach"))
    engine, zero = initialize(model, optimizer, case["deepspeed"], int(case["batch"]), fake, w.accum)
    w.model, w.optimizer, w.backward = engine, EngineOptimizer(engine, optimizer, zero), engine.backward
    return w
