"""The peak of a training step or an inference request for every row of a frame: which plan answers the frame, and
the entry points that evaluate it.

    estimate_components    component columns, peak_allocated_bytes and peak_phase (estimate.py builds the frame)
    phase_totals           every phase's total per row; phase_totals_in_batch the same as a function of the batch
                           (fit.py), named_phase_totals with the phase names
    host_check             host memory per node of frames with parallel layouts (offload), batch-independent

A frame is answered by one of: the traced moments of a derived model (components/derived.py), the training plan of
one GPU (components/train_plan.py), the inference plan of layer
nets and params models or the phases of transformer inference (components/infer_plan.py), or, for frames with
parallel columns (issue 4), the plans over parallel layouts (parallel/plan.py). The plans themselves, their
evaluation and their cache are components/plan.py.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from . import columns as C
from .components import activations as act
from .components import derived, derived_lines
from .components.infer_plan import InferTables, infer_phases, infer_plan
from .components.plan import Plan, cached, codes, combine, ints, pick_phases, precisions
from .components.train_plan import train_plan
from .errors import UsageError
from .models.arch import Architecture
from .parallel import layout as par_layout
from .parallel import plan as par_plan
from .units import parse_size


def one_gpu(arch: Architecture, frame: pd.DataFrame) -> pd.DataFrame:
    """A frame of a model whose layouts are planned on one GPU only (planned from its own code, or adapters on a
    hand-modelled family: the config allows them gradient accumulation alone) without its parallel columns, each
    row that accumulates over several micro-batches keeping its gradients as zero_grad 'zeros' keeps them: the
    gradients of a micro-batch are live through the next one's forward and backward, which accumulates into them
    (the measured LoRA cases with accumulation: tests/data/truth/finetune). Sharded by FSDP2, they are the rank's
    gradient shards, into which every micro-batch's reduce-scatter accumulates (tests/data/truth/sharded/*accum*)."""
    if not par_layout.has_parallel_columns(frame) or not (
            arch.kind == "derived" or (arch.finetune is not None and arch.finetune.adapters)):
        return frame
    if arch.kind != "derived" and all(lay.deepspeed_data_parallel for lay in par_layout.frame_layouts(frame)[1]):
        return frame  # LoRA under DeepSpeed ZeRO over data-parallel ranks: its parallel plan (parallel/plan.py)
    # a model planned from its own code may also be sharded as FSDP2 shards it over data-parallel ranks alone
    # (zero_stage 2 or 3; 0 replicates it: one GPU's plan per rank): the estimator reads those two columns
    # (components/derived.py, its traced sharded plans)
    sharding = (C.DATA_PARALLEL, C.ZERO_STAGE, C.DDP_BUCKET_VIEW, C.FSDP_VERSION, C.OFFLOAD, C.BACKWARD_PREFETCH) \
        if arch.kind == "derived" else ()
    off = [c for c in C.PARALLEL_AXES if c not in (C.GRADIENT_ACCUMULATION, C.GRADIENT_SYNC) and c not in sharding
           and c in frame.columns
           and (frame[c].astype(str) != str(C.PARALLEL_DEFAULTS[c])).any()]
    if sharding and C.ZERO_STAGE in frame.columns and (ints(frame, C.ZERO_STAGE) == 1).any():
        off.append(f"{C.ZERO_STAGE} 1 (FSDP shards gradients with the optimizer state: use 2 or 3)")
    what = f"finetune method {arch.finetune.method}" if arch.finetune is not None and arch.finetune.adapters \
        else f"{arch.name} (planned from its own code)"
    problem = _offload_problem(frame) if sharding and C.OFFLOAD in frame.columns else None
    if problem:
        raise UsageError(f"{what}: {problem}")
    if off:
        reach = ("FSDP over data_parallel (zero_stage 2 or 3) and gradient accumulation" if sharding
                 else "one GPU, with gradient accumulation at most")
        raise UsageError(f"{what} is modelled on {reach}: {', '.join(off)} is not modelled for it")
    frame = derived.with_kept_gradients(frame)
    if C.ZERO_GRAD not in frame.columns:
        frame = frame.assign(**{C.ZERO_GRAD: "set_to_none"})
    # the node's columns stay beside the sharding ones: an offloading rank's host memory is checked per node
    drop = [c for c in (*C.PARALLEL_AXES, C.GPUS_PER_NODE, C.HOST_MEMORY) if c in frame.columns
            and c not in sharding and not (sharding and c in (C.GPUS_PER_NODE, C.HOST_MEMORY))]
    return frame.drop(columns=drop)


def _offload_problem(frame: pd.DataFrame) -> str | None:
    """What a derived model's offload column asks that is not modelled (parallel/layout.py fsdp_offload_problem, read
    over the rows that offload: FSDP1's CPUOffload alone is); None where nothing is."""
    rows = frame[C.OFFLOAD].astype(str).to_numpy() != "none"
    if not rows.any():
        return None
    axes = {c: tuple(frame.loc[rows, c].unique()) for c in (C.OFFLOAD, C.FSDP_VERSION, C.ZERO_STAGE, C.DATA_PARALLEL,
                                                            C.GRADIENT_ACCUMULATION) if c in frame.columns}
    return par_layout.fsdp_offload_problem(axes)


def estimate_components(arch: Architecture, mode: str, frame: pd.DataFrame, device: str = "cuda", *,
                        prefill_logits: str = "last") -> dict[str, object]:
    """Component columns, peak_allocated_bytes and peak_phase for every row of `frame` (the grid axes).
    device="cpu" models what a CPU run keeps (dropout noise tensors instead of bool masks): for comparing with the
    CPU-measured ground truth only. prefill_logits (infer): "last" as generate() (logits_to_keep=1), "all" for a
    prefill that computes the logits of every prompt position."""
    frame = one_gpu(arch, frame)
    if arch.kind == "derived":  # the model's own traced moments (components/derived.py)
        out = derived.frame_components(arch, mode, frame, device)
        if derived.HOST_PER_RANK in out:  # FSDP1's CPU offload
            out[C.HOST], out[C.HOST_FITS] = _host(out.pop(derived.HOST_PER_RANK), frame)
        return out
    plan, k, b, s = _prepare(arch, mode, frame, device, prefill_logits=prefill_logits)
    if plan is None:
        return pick_phases(*_infer_any(arch, frame, k, b, s), len(frame))
    out = plan.pick(k, b, s)
    if plan.host is not None:
        out[C.HOST], out[C.HOST_FITS] = _host(plan.host[k], frame)
    return out


def _host(per_rank: np.ndarray, frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Host bytes per node (per rank x GPUs per node) and whether the node's RAM holds them."""
    n = len(per_rank)
    gpn = ints(frame, C.GPUS_PER_NODE) if C.GPUS_PER_NODE in frame.columns else \
        np.full(n, par_layout.DEFAULT_GPUS_PER_NODE, dtype=np.int64)
    ram = ints(frame, C.HOST_MEMORY) if C.HOST_MEMORY in frame.columns else \
        np.full(n, parse_size(par_layout.DEFAULT_HOST_MEMORY), dtype=np.int64)
    host = per_rank * gpn
    return host, host <= ram


def host_check(arch: Architecture, mode: str, frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray] | None:
    """(host bytes per node, host fits) for frames with parallel columns (batch-independent), else None."""
    frame = one_gpu(arch, frame)
    if mode != "train" or not par_layout.has_parallel_columns(frame):
        return None
    if arch.kind == "derived":  # FSDP1's CPU offload alone puts a derived model's states on the host
        per_rank = derived.frame_host(arch, frame)
        return None if per_rank is None else _host(per_rank, frame)
    plan, k, _, _ = _prepare(arch, mode, frame, "cuda", read_batch=False)
    return _host(plan.host[k], frame) if plan.host is not None else None


def phase_totals(arch: Architecture, mode: str, frame: pd.DataFrame, device: str = "cuda", *,
                 prefill_logits: str = "last") -> list[np.ndarray]:
    """The total of every phase for every row (-1 where a phase does not happen): affine in batch each."""
    frame = one_gpu(arch, frame)
    if arch.kind == "derived":
        return derived.frame_phase_totals(arch, mode, frame, device)(ints(frame, C.BATCH))[0]
    plan, k, b, s = _prepare(arch, mode, frame, device, prefill_logits=prefill_logits)
    if plan is None:
        return _infer_any(arch, frame, k, b, s)[0]
    return list(plan.phase_totals(k, b, s))


def phase_totals_in_batch(arch: Architecture, mode: str, frame: pd.DataFrame, device: str = "cuda", *,
                          prefill_logits: str = "last"):
    """phase_totals as a function of the batch: `f(b) -> list of per-phase totals` for the rows of `frame` (whose
    batch column, if any, is ignored). The columns are read and the plan looked up once (fit.py calls it often)."""
    frame = one_gpu(arch, frame)
    if arch.kind == "derived":
        return derived_lines.frame_batch_lines(arch, mode, frame, device)
    plan, k, _, s = _prepare(arch, mode, frame, device, read_batch=False, prefill_logits=prefill_logits)

    def at(b: np.ndarray) -> list[np.ndarray]:
        b = np.asarray(b, dtype=np.int64)
        if plan is None:
            return _infer_any(arch, frame, k, b, s)[0]
        return list(plan.phase_totals(k, b, s))

    return at


def named_phase_totals(arch: Architecture, mode: str, frame: pd.DataFrame, device: str = "cuda", *,
                       prefill_logits: str = "last") -> list[tuple[str, np.ndarray]]:
    """(phase name, total per row) for every modelled moment; a phase may be modelled at several moments."""
    frame = one_gpu(arch, frame)
    if arch.kind == "derived":
        totals, names = derived.frame_phase_totals(arch, mode, frame, device)(ints(frame, C.BATCH))
        return list(zip(names, totals))
    plan, k, b, s = _prepare(arch, mode, frame, device, prefill_logits=prefill_logits)
    if plan is None:
        totals, _, names = _infer_any(arch, frame, k, b, s)
        return list(zip(names, totals))
    return list(zip(plan.names, plan.phase_totals(k, b, s)))


def _prepare(arch: Architecture, mode: str, frame: pd.DataFrame, device: str, read_batch: bool = True,
             prefill_logits: str = "last"):
    """(plan, combination code, batch, seq_len); plan None for transformer inference (then the code is that of
    (precision, attention))."""
    if device not in act.DEVICES:
        raise UsageError(f"unknown device {device!r}; use {' or '.join(act.DEVICES)}")
    if prefill_logits not in act.PREFILL_LOGITS:
        raise UsageError(f"unknown prefill_logits {prefill_logits!r}; use {' or '.join(act.PREFILL_LOGITS)}")
    b = ints(frame, C.BATCH) if read_batch else None
    s = ints(frame, C.SEQ_LEN)
    p_code, p_names = codes(frame, C.PRECISION)
    if mode == "train":
        precisions(p_names, mode)  # checked before any other column is read
        o_code, o_names = codes(frame, C.OPTIMIZER)
        i_code, i_names = codes(frame, C.OPTIMIZER_IMPL)
        axis_codes = [p_code, o_code, i_code]
        names: tuple = (p_names, o_names, i_names)
        if arch.kind == "transformer":
            a_code, a_names = codes(frame, C.ATTENTION)
            c_code, c_names = codes(frame, C.CHECKPOINTING)
            axis_codes += [a_code, c_code]
            names += (a_names, c_names)
        if par_layout.has_parallel_columns(frame):
            if kept_gradients(frame):
                raise UsageError("zero_grad 'zeros' is not modelled with a parallel: block yet; use set_to_none")
            return par_plan.prepare_train(arch, mode, frame, device, axis_codes, names, b, s)
        z_names: tuple = ()
        if C.ZERO_GRAD in frame.columns:  # optional axis: the plan's last one when the frame has it
            z_code, z_names = codes(frame, C.ZERO_GRAD)
            axis_codes.append(z_code)
        if arch.kind != "transformer":
            names += ((), ())  # the plan's attention and checkpointing names: none
        plan = cached(arch, ("train", device, *names, z_names), lambda: train_plan(arch, device, *names, z_names))
        return plan, combine(axis_codes, plan.sizes), b, s
    if mode == "infer":
        if par_layout.has_parallel_columns(frame):  # tensor and pipeline parallel inference: a rank's model
            key = par_plan.infer_key(arch, mode, frame, p_code, p_names, prefill_logits)
            if key is not None:
                return None, key, b, s
        if arch.kind != "transformer":
            plan = cached(arch, ("infer", p_names), lambda: infer_plan(arch, p_names))
            return plan, p_code.astype(np.int64), b, s
        precisions(p_names, mode)
        a_code, a_names = codes(frame, C.ATTENTION)
        tables = cached(arch, ("infer-tables", p_names, a_names, prefill_logits),
                        lambda: InferTables(arch, p_names, a_names, prefill_logits))
        return None, (tables, p_code.astype(np.int64), a_code), b, s
    precisions(p_names, mode)
    raise UsageError(f"unknown mode {mode!r}; use train or infer")


def kept_gradients(frame: pd.DataFrame) -> bool:
    """Whether any row keeps its gradients between steps (zero_grad "zeros"; the column is optional)."""
    return C.ZERO_GRAD in frame.columns and bool((frame[C.ZERO_GRAD].astype(str) == "zeros").any())


def _infer_any(arch, frame, key, b, s):
    """infer_phases, or for a frame with parallel layouts parallel/plan.py's infer_layouts (each layout on its
    rank's model)."""
    if key[0] != "parallel":
        return infer_phases(arch, frame, key, b, s)
    return par_plan.infer_layouts(arch, frame, key, b, s)
