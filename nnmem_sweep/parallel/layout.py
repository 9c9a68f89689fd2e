"""The parallel layout of a grid point, read from the frame's parallel columns (columns.PARALLEL_AXES).

A frame names its layouts by combination: the estimator factorises the parallel columns jointly into a few unique
`Layout`s and builds its plan once per layout (parallel/plan.py), so a grid of a million rows over four layouts
costs four plan builds, not a million.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .. import columns as C
from ..components.plan import codes
from ..errors import UsageError
from ..models.arch import Architecture

SCHEDULES = ("1f1b", "interleaved")
OFFLOADS = ("none", "optimizer", "optimizer+params")
INFER_AXES = (C.TENSOR_PARALLEL, C.PIPELINE_PARALLEL, C.DATA_PARALLEL)  # what inference is split by
DEFAULT_GPUS_PER_NODE = 8  # an 8-GPU node (DGX/HGX H100, A100)
DEFAULT_HOST_MEMORY = "2 TiB"  # DGX H100: 2 TB of system memory


@dataclass(frozen=True)
class Layout:
    dp: int = 1  # data_parallel
    zero: int = 0  # zero_stage
    tp: int = 1  # tensor_parallel
    sp: bool = False  # sequence_parallel
    pp: int = 1  # pipeline_parallel
    micro_batches: int = 1
    schedule: str = "1f1b"
    virtual: int = 1  # virtual_stages
    cp: int = 1  # context_parallel
    ep: int = 1  # expert_parallel
    offload: str = "none"
    accum: int = 1  # gradient_accumulation
    fp32_grads: bool = False  # fp32_grad_accumulation
    reduce_bucket: int = 0  # DeepSpeed reduce_bucket_size (elements; 0: not DeepSpeed)
    overlap_comm: bool = False  # DeepSpeed overlap_comm
    prefetch_bucket: int = 0  # DeepSpeed stage3_prefetch_bucket_size (elements)
    sync: str = "each"  # gradient_sync: each | last (columns.GRADIENT_SYNC)
    bucket_view: bool = False  # ddp_bucket_view: DDP's gradient_as_bucket_view
    fsdp_version: int = 2  # fsdp_version: FSDP1 (FullyShardedDataParallel) or FSDP2 (fully_shard)
    prefetch: str = "pre"  # backward_prefetch: FSDP1's BACKWARD_PRE or none (accelerate's default)

    @property
    def fsdp1(self) -> bool:
        """FSDP1 (FullyShardedDataParallel) rather than FSDP2, where FSDP shards the layout (parallel/fsdp.py)."""
        return self.fsdp_version == 1

    @property
    def ddp(self) -> bool:
        """PyTorch's DDP runs the layout: data-parallel ranks alone at zero_stage 0 (Megatron's own DDP with TP, PP
        or fp32 main grads; ZeRO and FSDP shard instead)."""
        return self.dp >= 2 and self.zero == 0 and not self.splits_model and not self.fp32_grads

    @property
    def deepspeed(self) -> bool:
        """A DeepSpeed ZeRO layout (its buffers counted: parallel/states.py deepspeed_buffers)."""
        return self.zero >= 1 and (self.reduce_bucket > 0 or self.prefetch_bucket > 0)

    @property
    def deepspeed_data_parallel(self) -> bool:
        """DeepSpeed ZeRO-1/2/3 over data-parallel ranks alone (accumulating or not), ZeRO-1/2 with ZeRO-Offload or
        not: the layouts a LoRA step under DeepSpeed is planned for (parallel/states.py _adapter_states; the
        scenario's: deepspeed_dp_only)."""
        offload_ok = self.offload == "none" or (self.offload == "optimizer" and self.zero in (1, 2))
        return self.deepspeed and self.zero in (1, 2, 3) and not self.splits_model and offload_ok

    @property
    def unsharded_grads_kept(self) -> bool:
        """Whether the micro-batches before the last keep whole unsharded gradients: FSDP's sharded gradients
        (zero_stage >= 2) synced only at the last micro-batch (accelerate's no_sync)."""
        return self.sync == "last" and self.accum > 1 and self.zero >= 2

    @property
    def t_sp(self) -> int:
        """The tensor-parallel factor the sequence is split by outside attention (t with SP, else 1)."""
        return self.tp if self.sp else 1

    @property
    def seq_divisor(self) -> int:
        """s_local = s / seq_divisor: the tokens of a sequence one rank holds (sequence and context parallel)."""
        return self.t_sp * self.cp

    @property
    def splits_model(self) -> bool:
        """Whether activations or the transformer's tensors are split (anything but data parallel and ZeRO)."""
        return self.tp > 1 or self.pp > 1 or self.cp > 1 or self.ep > 1

    @property
    def single_stage_in_flight(self) -> int:
        """Micro-batches whose activations the first pipeline stage keeps at once (1F1B: min(p, m))."""
        return min(self.pp, self.micro_batches) if self.pp > 1 else 1


# columns -> Layout fields
_FIELDS = {C.DATA_PARALLEL: "dp", C.ZERO_STAGE: "zero", C.TENSOR_PARALLEL: "tp", C.SEQUENCE_PARALLEL: "sp",
           C.PIPELINE_PARALLEL: "pp", C.MICRO_BATCHES: "micro_batches", C.PIPELINE_SCHEDULE: "schedule",
           C.VIRTUAL_STAGES: "virtual", C.CONTEXT_PARALLEL: "cp", C.EXPERT_PARALLEL: "ep", C.OFFLOAD: "offload",
           C.GRADIENT_ACCUMULATION: "accum", C.FP32_GRAD_ACCUMULATION: "fp32_grads",
           C.REDUCE_BUCKET: "reduce_bucket", C.OVERLAP_COMM: "overlap_comm", C.PREFETCH_BUCKET: "prefetch_bucket",
           C.GRADIENT_SYNC: "sync", C.DDP_BUCKET_VIEW: "bucket_view",
           C.FSDP_VERSION: "fsdp_version", C.BACKWARD_PREFETCH: "prefetch"}
_STR = (C.PIPELINE_SCHEDULE, C.OFFLOAD, C.GRADIENT_SYNC, C.BACKWARD_PREFETCH)
GRADIENT_SYNCS = ("each", "last")
FSDP_VERSIONS = (1, 2)
BACKWARD_PREFETCHES = ("pre", "none")


_PARALLEL = frozenset(C.PARALLEL_AXES)


def has_parallel_columns(frame: pd.DataFrame) -> bool:
    """Whether the frame names any parallel axis (~1.5 us: the estimator asks on every call)."""
    return not _PARALLEL.isdisjoint(frame.columns.tolist())


def typed_value(col: str, v):
    """A parallel axis's value as its Layout field holds it (text from a CSV or a command line too); a value of the
    wrong kind is a UsageError naming the axis."""
    if col in C.PARALLEL_BOOL_AXES:
        if isinstance(v, str):
            if v.lower() not in ("true", "false"):
                raise UsageError(f"{col} must be true or false, got {v!r}")
            return v.lower() == "true"
        return bool(v)
    if col in _STR:
        return str(v)
    try:
        return int(v)
    except (TypeError, ValueError):
        raise UsageError(f"{col} must be an integer, got {v!r}") from None


def frame_layouts(frame: pd.DataFrame) -> tuple[np.ndarray, tuple[Layout, ...]]:
    """One layout code per row and the unique layouts, from the parallel columns present (absent: defaults)."""
    present = [a for a in C.PARALLEL_AXES if a in frame.columns]
    n = len(frame)
    if not present:
        return np.zeros(n, dtype=np.intp), (Layout(),)
    per = [codes(frame, a) for a in present]
    sizes = [max(len(v), 1) for _, v in per]
    if len(present) == 1:
        combo = np.asarray(per[0][0], dtype=np.intp)
    else:
        combo = np.ravel_multi_index([np.asarray(c, dtype=np.intp) for c, _ in per], sizes)
    uniq, inverse = np.unique(combo, return_inverse=True)
    idx = np.unravel_index(uniq, sizes) if len(present) > 1 else (uniq,)
    layouts = []
    for j in range(len(uniq)):
        kw = {_FIELDS[a]: typed_value(a, per[i][1][int(idx[i][j])]) for i, a in enumerate(present)}
        layouts.append(Layout(**kw))
    return inverse.reshape(-1).astype(np.intp), tuple(layouts)


def problems(arch: Architecture | None, lay: Layout, mode: str = "train") -> list[tuple[str, str]]:
    """(column, message) for every rule the layout breaks (seq_len is checked by `seq_problem`)."""
    out: list[tuple[str, str]] = []
    if mode != "train":  # inference: a model split by tensor and pipeline parallelism (replicas change nothing)
        train_only = [(col, getattr(lay, f)) for col, f in _FIELDS.items()
                      if col not in INFER_AXES and getattr(lay, f) != getattr(Layout(), f)]
        if train_only:
            return [(col, f"{col} applies to train mode only; inference models tensor_parallel, pipeline_parallel "
                          "and data_parallel") for col, _ in train_only]
    for col, v in ((C.DATA_PARALLEL, lay.dp), (C.TENSOR_PARALLEL, lay.tp), (C.PIPELINE_PARALLEL, lay.pp),
                   (C.MICRO_BATCHES, lay.micro_batches), (C.VIRTUAL_STAGES, lay.virtual),
                   (C.CONTEXT_PARALLEL, lay.cp), (C.EXPERT_PARALLEL, lay.ep), (C.GRADIENT_ACCUMULATION, lay.accum)):
        if v < 1:
            out.append((col, f"{col} must be at least 1, got {v}"))
    for col, v in ((C.REDUCE_BUCKET, lay.reduce_bucket), (C.PREFETCH_BUCKET, lay.prefetch_bucket)):
        if v < 0:
            out.append((col, f"{col} must be at least 0, got {v}"))
    if lay.zero not in (0, 1, 2, 3):
        out.append((C.ZERO_STAGE, f"zero_stage must be 0, 1, 2 or 3, got {lay.zero}"))
    if lay.schedule not in SCHEDULES:
        out.append((C.PIPELINE_SCHEDULE, f"pipeline_schedule must be one of {', '.join(SCHEDULES)}, got "
                                         f"{lay.schedule!r}"))
    if lay.offload not in OFFLOADS:
        out.append((C.OFFLOAD, f"offload must be one of {', '.join(OFFLOADS)}, got {lay.offload!r}"))
    if lay.fsdp_version not in FSDP_VERSIONS:
        out.append((C.FSDP_VERSION, f"fsdp_version must be 1 (FullyShardedDataParallel) or 2 (fully_shard), got "
                                    f"{lay.fsdp_version}"))
    if lay.prefetch not in BACKWARD_PREFETCHES:
        out.append((C.BACKWARD_PREFETCH, f"backward_prefetch must be pre (BACKWARD_PRE) or none (no prefetch), got "
                                         f"{lay.prefetch!r}"))
    if lay.sync not in GRADIENT_SYNCS:
        out.append((C.GRADIENT_SYNC, f"gradient_sync must be one of {', '.join(GRADIENT_SYNCS)}, got {lay.sync!r}"))
    if out:
        return out
    if lay.unsharded_grads_kept and (lay.deepspeed or lay.offload != "none"):
        # accelerate skips no_sync under DeepSpeed ZeRO >= 2, which reduces every micro-batch's gradients itself
        out.append((C.GRADIENT_SYNC, "gradient_sync last (FSDP's no_sync) is modelled for FSDP without offload; "
                                     "DeepSpeed ZeRO-2/3 reduces every micro-batch (use gradient_sync each)"))
    if lay.fsdp1 and lay.deepspeed:
        out.append((C.FSDP_VERSION, "fsdp_version 1 names PyTorch's FSDP1; this layout is DeepSpeed's ZeRO "
                                    "(reduce_bucket_size given): leave fsdp_version at 2"))
    if lay.prefetch == "none" and not lay.fsdp1:
        out.append((C.BACKWARD_PREFETCH, "backward_prefetch none is FSDP1's (FullyShardedDataParallel's "
                                         "backward_prefetch=None): give fsdp_version 1 (FSDP2 always prefetches the "
                                         "next block's all-gather in the backward)"))
    if lay.offload == "optimizer+params" and lay.zero != 3 and not _fsdp_grad_op_offload(arch, lay):
        out.append((C.OFFLOAD, f"offload optimizer+params needs zero_stage 3 (parameters are offloaded as ZeRO-3 "
                               f"partitions; FSDP's CPU offload also at 2, for a transformer sharded over "
                               f"data_parallel alone, one micro-batch a step), got zero_stage {lay.zero}"))
    elif lay.offload == "optimizer" and lay.zero == 0:
        out.append((C.OFFLOAD, "offload optimizer needs zero_stage 1, 2 or 3 (ZeRO-Offload moves the optimizer "
                               "partition of each rank), got zero_stage 0"))
    if lay.schedule == "interleaved":
        if lay.pp < 2 or lay.virtual < 2:
            out.append((C.VIRTUAL_STAGES, f"the interleaved schedule needs pipeline_parallel > 1 and virtual_stages "
                                          f"> 1, got pipeline_parallel {lay.pp}, virtual_stages {lay.virtual}"))
        elif lay.micro_batches % lay.pp:
            out.append((C.MICRO_BATCHES, f"the interleaved schedule needs micro_batches a multiple of "
                                         f"pipeline_parallel {lay.pp}, got {lay.micro_batches}"))
    elif lay.virtual != 1:
        out.append((C.VIRTUAL_STAGES, f"virtual_stages {lay.virtual} needs pipeline_schedule interleaved"))
    if lay.ep > 1 and lay.dp % lay.ep:
        out.append((C.EXPERT_PARALLEL, f"expert_parallel {lay.ep} must divide data_parallel {lay.dp} (expert "
                                       "ranks are carved out of the data-parallel ranks)"))
    if arch is None or arch.kind == "derived":  # a derived model takes no parallel layout (config_blocks says so)
        return out
    if arch.kind != "transformer":
        for col, v in ((C.TENSOR_PARALLEL, lay.tp), (C.PIPELINE_PARALLEL, lay.pp), (C.CONTEXT_PARALLEL, lay.cp),
                       (C.EXPERT_PARALLEL, lay.ep), (C.VIRTUAL_STAGES, lay.virtual)):
            if v != 1:
                out.append((col, f"{col} {v} splits a transformer's layers; this model is a "
                                 f"{'layer list' if arch.kind == 'layers' else 'parameter count'} (use data_parallel, "
                                 "zero_stage, offload, gradient_accumulation)"))
        if lay.unsharded_grads_kept:
            out.append((C.GRADIENT_SYNC, "gradient_sync last (FSDP's no_sync) is modelled for transformers; this "
                                         f"model is a {'layer list' if arch.kind == 'layers' else 'parameter count'}"))
        return out
    if arch.heads % lay.tp or arch.kv_heads % lay.tp:
        out.append((C.TENSOR_PARALLEL, f"tensor_parallel {lay.tp} must divide the {arch.heads} attention heads and "
                                       f"the {arch.kv_heads} KV heads"))
    if arch.layers < lay.pp:
        out.append((C.PIPELINE_PARALLEL, f"pipeline_parallel {lay.pp} is more stages than the {arch.layers} layers"))
    elif lay.schedule == "interleaved" and lay.virtual > 1 and arch.layers % (lay.pp * lay.virtual):
        out.append((C.VIRTUAL_STAGES, f"the interleaved schedule needs the {arch.layers} layers divisible by "
                                      f"pipeline_parallel x virtual_stages = {lay.pp * lay.virtual}"))
    if lay.ep > 1 and (not arch.num_experts or arch.num_experts % lay.ep):
        what = f"the {arch.num_experts} experts" if arch.num_experts else "experts (this model has none)"
        out.append((C.EXPERT_PARALLEL, f"expert_parallel {lay.ep} must divide {what}"))
    return out


def _fsdp_grad_op_offload(arch: Architecture | None, lay: Layout) -> bool:
    """FSDP's CPU offload under SHARD_GRAD_OP (FSDP1's CPUOffload, FSDP2's CPUOffloadPolicy at zero_stage 2), which a
    transformer sharded over data_parallel alone is planned for from its rank's traced step (config_model: a
    full fine-tune's offload twin, adapters' derived twin; measured, tests/data/truth/sharded/*-offload-*), one
    micro-batch a step as fsdp_offload_problem requires (else the hand model would take it, with no unsharded
    parameter on the GPU)."""
    return (lay.zero == 2 and not lay.deepspeed and lay.dp > 1 and lay.tp == lay.pp == lay.cp == lay.ep == 1
            and lay.accum == 1 and arch is not None and arch.kind in ("transformer", "derived"))


def seq_problem(lay: Layout, seq_len: int) -> str | None:
    """seq_len must split evenly over the sequence-parallel and context-parallel ranks."""
    if seq_len % lay.seq_divisor:
        parts = []
        if lay.t_sp > 1:
            parts.append(f"tensor_parallel {lay.tp} (sequence_parallel)")
        if lay.cp > 1:
            parts.append(f"context_parallel {lay.cp}")
        return f"seq_len {seq_len:,} must be divisible by {' x '.join(parts)} = {lay.seq_divisor}"
    return None


def check(arch: Architecture, layouts: tuple[Layout, ...], mode: str, seq_lens=()) -> None:
    """UsageError (one line) for the first broken rule: frames built by hand (estimate.estimate_frame)."""
    for lay in layouts:
        bad = problems(arch, lay, mode)
        if bad:
            raise UsageError(f"{bad[0][0]}: {bad[0][1]}")
        for s in seq_lens:
            msg = seq_problem(lay, int(s))
            if msg:
                raise UsageError(msg)


# the axes besides data_parallel and zero_stage that each sharded family takes off their default (fsdp_only,
# deepspeed_dp_only; config_model names the others in its refusal)
FSDP_AXES = (C.GRADIENT_ACCUMULATION, C.GRADIENT_SYNC, C.DDP_BUCKET_VIEW, C.FSDP_VERSION, C.OFFLOAD,
             C.BACKWARD_PREFETCH)
DEEPSPEED_AXES = (C.REDUCE_BUCKET, C.OVERLAP_COMM, C.PREFETCH_BUCKET, C.GRADIENT_ACCUMULATION)


def deepspeed_layouts(axes: dict, every: bool = False) -> bool:
    """Whether the layouts of `axes` ({axis: values}: a `parallel:` block, a scenario's axis values) are DeepSpeed's
    (a reduce bucket given): any of them, or `every` one."""
    given = [int(b) > 0 for b in axes.get(C.REDUCE_BUCKET, (0,))]
    return all(given) if every else any(given)


def fsdp_versions(axes: dict) -> set[int]:
    """The FSDP versions the layouts of `axes` ({axis: values}: a `parallel:` block, a scenario's axis values) name:
    {2} where none is given."""
    return {int(v) for v in axes.get(C.FSDP_VERSION, (C.PARALLEL_DEFAULTS[C.FSDP_VERSION],))}


def fsdp_only(parallel: dict) -> bool:
    """A `parallel:` block a model planned from its own code takes: data-parallel ranks sharded as FSDP2 (or FSDP1:
    fsdp_version) shards them (zero_stage 0, 2 or 3, nothing else off its default but gradient accumulation: every
    micro-batch reduce-scatters into the rank's kept gradient shards); its plans are the sharded step traced on
    PyTorch's fake process group (workload/fsdp.py). Offload: FSDP1's CPUOffload alone (fsdp_offload_problem)."""
    return _only(parallel, FSDP_AXES, {0, 2, 3}) and fsdp_offload_problem(parallel) is None


def fsdp_offloads(parallel: dict) -> bool:
    """Whether a `parallel:` block ({axis: values}) offloads as FSDP does (FSDP1's CPUOffload, FSDP2's
    CPUOffloadPolicy), which a model is planned for from its own code (its rank's step traced with the host told
    apart), a hand-modelled family through its twin."""
    return bool(parallel) and fsdp_only(parallel) and \
        C.OFFLOAD_PARAMS in {str(v) for v in parallel.get(C.OFFLOAD, ())}


def fsdp_offload_problem(parallel: dict) -> str | None:
    """Why a `parallel:` block's offload is not FSDP's CPU offload (FSDP1's CPUOffload(offload_params=True), FSDP2's
    CPUOffloadPolicy: offload optimizer+params over data-parallel ranks sharded at zero_stage 2 or 3, one
    micro-batch per step), the one offload a model planned from its own code is traced with; None where it is, or
    where nothing is offloaded."""
    offloads = {str(v) for v in parallel.get(C.OFFLOAD, ("none",))} - {"none"}
    if not offloads:
        return None
    if offloads != {C.OFFLOAD_PARAMS}:
        return (f"offload {sorted(offloads - {C.OFFLOAD_PARAMS})[0]} is ZeRO-Offload's (DeepSpeed); FSDP offloads the "
                f"parameters with the optimizer (FSDP1's CPUOffload, FSDP2's CPUOffloadPolicy): offload "
                f"{C.OFFLOAD_PARAMS}")
    if not {int(z) for z in parallel.get(C.ZERO_STAGE, (0,))} <= {2, 3} or \
            min(int(d) for d in parallel.get(C.DATA_PARALLEL, (1,))) < 2:
        return f"offload {C.OFFLOAD_PARAMS} needs FSDP sharding: data_parallel > 1 and zero_stage 2 or 3"
    if any(int(a) > 1 for a in parallel.get(C.GRADIENT_ACCUMULATION, (1,))):
        return (f"offload {C.OFFLOAD_PARAMS} with gradient_accumulation > 1 is not modelled (FSDP1 does not "
                "accumulate an offloaded gradient outside no_sync, _flat_param.py says so; FSDP2 adds it on the host); "
                "give gradient_accumulation 1")
    return None


# What the H100's recording of LoRA under FSDP1 with CPU offload showed (validation/gpu-fsdp.yaml, 2026-11-28): said
# where a scenario plans FSDP1's offload, until a GPU measures its least capacity
FSDP1_OFFLOAD_TIE = 0.125  # that recording's need above its peak: the decision page's band reaches it
FSDP1_OFFLOAD_GAP = ("an H100's recording of LoRA under FSDP1 with CPU offload (Llama 3.2 1B, a rank of 2, 2 x 1,024 "
                     f"tokens) needs {FSDP1_OFFLOAD_TIE:.1%} above its peak in the allocator model where its traced "
                     "plan needs 1.0 %: in its second step a 32 MiB activation splits the cached 1.05 GB segment the "
                     "fp32 logits' gradient needs at the loss, a tie that small differences of the sequence decide; "
                     "its least capacity is not measured yet, so an offloaded FSDP1 row's reserve may be low by up "
                     "to that much")


def deepspeed_dp_only(parallel: dict) -> bool:
    """A `parallel:` block that is DeepSpeed ZeRO-1/2/3 over data-parallel ranks alone (its reduce bucket given, its
    gradient accumulation, nothing else off its default): the layouts LoRA under DeepSpeed is modelled for
    (states.py _adapter_states; per layout, Layout.deepspeed_data_parallel)."""
    return deepspeed_layouts(parallel, every=True) and _only(parallel, (*DEEPSPEED_AXES, C.OFFLOAD), {1, 2, 3}) and \
        deepspeed_offload_problem(parallel) is None


def deepspeed_offload_problem(parallel: dict) -> str | None:
    """Why adapters under DeepSpeed are not planned with a `parallel:` block's offload (ZeRO-Offload is: offload
    optimizer at zero_stage 1 or 2, the rank's step traced with its host told apart); None where they are."""
    offloads = {str(v) for v in parallel.get(C.OFFLOAD, ("none",))} - {"none"}
    if not offloads:
        return None
    if offloads != {"optimizer"}:
        return ("offload optimizer+params under DeepSpeed is ZeRO-3's offload_param, not modelled for adapters; "
                "ZeRO-Offload is: offload optimizer at zero_stage 1 or 2")
    if 3 in {int(z) for z in parallel.get(C.ZERO_STAGE, (0,))}:
        return ("offload optimizer of adapters under DeepSpeed is modelled at zero_stage 1 or 2 (ZeRO-Offload; "
                "ZeRO-3 partitions real tensors only, which no fake run traces)")
    return None


def _only(parallel: dict, also: tuple[str, ...], stages: set[int]) -> bool:
    """Data-parallel ranks at one of `stages`, every axis but those and `also` at its default."""
    if not parallel:
        return False
    if any(v != C.PARALLEL_DEFAULTS[a] for a, vs in parallel.items()
           if a not in (C.DATA_PARALLEL, C.ZERO_STAGE, *also) for v in vs):
        return False
    return set(int(z) for z in parallel.get(C.ZERO_STAGE, (0,))) <= stages
