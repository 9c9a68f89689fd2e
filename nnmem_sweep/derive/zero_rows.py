"""A scenario's DeepSpeed row as the `measure` case of its rank step: the model's config (a hand-modelled preset's
derived twin, or a derived model's), the batch, sequence, recipe and DeepSpeed settings of the row, or why no fake
run traces it (row_case); and its fresh sequences on both end ranks (end_rank_sequences), each recorded
(zero_sequence.py) in a process of its own: DeepSpeed keeps its process groups at module level past the fake
group's lifetime."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .. import columns as C

# the engine the sequences are traced with (validation/deepspeed-wheels.sh carries the same release to a GPU)
DEEPSPEED_VERSION = "0.19.8"
ENGINE_PRECISION = "bf16-master"  # DeepSpeed's bf16 mode: bf16 parameters and gradients, an fp32 partition


def installed() -> str:
    """The DeepSpeed release importable here ('' where there is none: cache.installed)."""
    from .cache import installed as release

    return release("deepspeed") or ""


def ready() -> bool:
    """Whether the release the rows are traced with is the one installed."""
    return installed() == DEEPSPEED_VERSION


# how to install it without pip pulling a CUDA build of torch as DeepSpeed's dependency
INSTALL = f"pip install deepspeed=={DEEPSPEED_VERSION} --no-deps"


# What an H100 measured of ZeRO-3 steps, which no fake run traces (row_case): each kind's least capacity over its peak
# allocated, cuBLAS workspaces included (make gpu-check: validation/gpu-deepspeed.yaml, DeepSpeed 0.19.8, torch
# 2.11.0+cu130; tests/test_deepspeed_reserve.py holds them to the committed runs). Where a kind's is above the default
# reserve, a ZeRO-3 row of that kind takes it (measured_zero3): the default was 9.8 % under the LoRA point's need.
# The LoRA step's blocks live on DeepSpeed's side streams, each a pool of its own: folded onto one stream its
# recording needs 1.5 % (tests/test_deepspeed_reserve.py).
ZERO3_MEASURED = {  # kind: (fraction, the run's folder under validation/gpu/, the point)
    "adapters": (0.161, "nvidia-h100-80gb-hbm3/2026-11-28-deepspeed",
                 "llama-3.2-1b-lora-r16-qv-ds2z3-bf16-master-adamw-b2-s1024"),
    "full": (0.035, "nvidia-h100-80gb-hbm3/2026-11-27-deepspeed-run3", "llama-3.2-1b-ds2z3-bf16-master-adamw-b2-s1024"),
}


MEASURED_PREFIX = "not replayed, measured"  # how measured_zero3's note begins


def adapters(arch) -> bool:  # noqa: ANN001 - an Architecture
    """Whether `arch` trains adapters on a frozen base (ZERO3_MEASURED's kinds)."""
    return arch.finetune is not None and bool(arch.finetune.adapters)


def measured_zero3(trains_adapters: bool, row: dict[str, Any], default: float) -> tuple[float, str] | None:
    """(the reserve a DeepSpeed ZeRO-3 row takes, what says so): measured_kind's; None for other rows."""
    if int(row.get(C.ZERO_STAGE, 0)) != 3 or int(row.get(C.REDUCE_BUCKET, 0)) <= 0:
        return None
    return measured_kind(trains_adapters, default)


def measured_kind(trains_adapters: bool, default: float) -> tuple[float, str] | None:
    """(the reserve, what says so) where a GPU measured ZeRO-3's kind of step (ZERO3_MEASURED: adapters on a frozen
    base, or a full fine-tune) needing more than `default`; None otherwise (the default holds)."""
    fraction, run, point = ZERO3_MEASURED["adapters" if trains_adapters else "full"]
    if fraction <= default:
        return None
    return fraction, (f"{MEASURED_PREFIX} (ZeRO-3 partitions real tensors only, which no fake run traces): "
                      f"the reserve an H100 measured for {point} ({fraction:.1%} above its peak; "
                      f"validation/gpu/{run}), above the {default:.0%} default")


def row_case(source, row: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:  # noqa: ANN001 - a ModelSource
    """(the measure case of a DeepSpeed row's rank step, without its rank; or None and why it is not traced)."""
    stage = int(row.get(C.ZERO_STAGE, 0))
    if int(row.get(C.REDUCE_BUCKET, 0)) <= 0 or stage < 1:  # zero_stage 0: PyTorch's DDP (parallel/layout.py)
        return None, "not a DeepSpeed layout"
    if stage == 3:
        return None, "ZeRO-3 partitions real tensors only, which no fake run traces"
    if str(row.get(C.PRECISION)) != ENGINE_PRECISION:
        return None, f"DeepSpeed's bf16 engine runs the recipe {ENGINE_PRECISION} alone"
    offload = str(row.get(C.OFFLOAD, "none"))
    if offload not in ("none", "optimizer"):  # (ZeRO-3's, refused above)
        return None, f"offload {offload} is ZeRO-3's, which no fake run traces"
    if source.kind != "hf" or source.preference_json or source.fsdp_json:
        return None, "no DeepSpeed step of this model is traced"
    spec: dict[str, Any] = {"world": int(row[C.DATA_PARALLEL]), "zero_stage": stage,
                            "reduce_bucket_size": int(row[C.REDUCE_BUCKET]),
                            "overlap_comm": bool(row.get(C.OVERLAP_COMM, False)),
                            # ZeRO-Offload: its host storages told apart (workload/zero_engine.py host_side)
                            **({"offload": offload} if offload != "none" else {})}
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


def end_ranks(case: dict[str, Any]) -> tuple[int, ...]:
    """The ranks a ZeRO-1/2 step is traced on: the two ends of the flat buffer its partitions cut (rank 0 holds the
    embedding's, the last the last layers' and an untied head's, whose gradients come first)."""
    return 0, int(case["deepspeed"]["world"]) - 1


def end_rank_sequences(case: dict[str, Any], workspace_bytes: int) -> dict[int, np.ndarray]:
    """{rank: the fresh sequence of `case` on it (fresh_events)} over end_ranks, each traced in a Python process of
    its own (not a multiprocessing child, which would import the caller's main module again), its output kept from
    the user's terminal; a failed trace is one line (DerivationError)."""
    import json
    import subprocess
    import sys
    import tempfile

    from ..workload.build import case_config
    from .source import DerivationError

    cfg = case_config(case)[0]
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for rank in end_ranks(case):
            job = Path(tmp) / f"rank{rank}.json"
            job.write_text(json.dumps([{**case, "deepspeed": {**case["deepspeed"], "rank": rank}}, cfg,
                                       workspace_bytes]))
            child = subprocess.Popen([sys.executable, "-c", CHILD, str(job)], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
            try:
                _, err = child.communicate()
            finally:  # stopped (a signal, an interrupt): the child goes too
                if child.poll() is None:
                    child.kill()
                    child.wait()
            if child.returncode != 0:  # the child's last line: its budget's, or the exception that stopped it
                last = (err.strip().splitlines() or ["no output"])[-1]
                raise DerivationError(last if child.returncode == 2 else f"DeepSpeed's step at batch "
                                      f"{case['batch']}, sequence {case['seq_len']}, rank {rank}: {last}")
            out[rank] = np.load(job.with_suffix(".npy"))
    return out


CHILD = "import sys; from nnmem_sweep.derive.zero_rows import trace_job; trace_job(sys.argv[1])"


def trace_job(path: str) -> None:
    """A child's work (end_rank_sequences): the fresh sequence of the case in `path` (JSON: case, config, workspace
    bytes) saved beside it as .npy, without the warnings DeepSpeed and torch print (fake tensors' data pointers,
    deprecated collectives)."""
    import json
    import logging
    import sys
    import warnings

    from . import budget
    from .source import DerivationError, quiet
    from .zero_sequence import fresh_events

    case, cfg, workspace_bytes = json.loads(Path(path).read_text())
    warnings.simplefilter("ignore")
    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
    label = f"DeepSpeed's ZeRO-{case['deepspeed']['zero_stage']} step, rank {case['deepspeed']['rank']}"
    try:  # bounded as a derivation is (budget.py): past it, one line
        with quiet(), budget.derivation(label), budget.probe(int(case["batch"]), int(case["seq_len"])):
            events = fresh_events(case, cfg, 2, workspace_bytes)
    except DerivationError as e:
        print(e, file=sys.stderr)
        raise SystemExit(2) from None
    np.save(Path(path).with_suffix(".npy"), events)
