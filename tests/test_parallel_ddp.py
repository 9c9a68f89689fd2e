"""PyTorch DDP's allreduce buckets (parallel/states.py ddp_bucket_bytes): measured on the CPU, then held by the
estimate of a data-parallel layout at zero_stage 0."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from nnmem_sweep import columns as C
from nnmem_sweep.catalog.precisions import get_precision
from nnmem_sweep.components.weights import gradients_bytes
from nnmem_sweep.estimate import estimate_frame
from nnmem_sweep.models.presets import load_preset
from nnmem_sweep.scenario import Overheads

torch = pytest.importorskip("torch")


def _peak(wrap: str) -> tuple[int, int]:
    """(MemTracker's peak over a step of an 8-layer fp32 stack, its gradients' bytes), the model plain or wrapped in
    DistributedDataParallel over a one-rank gloo group (the buckets do not depend on the ranks)."""
    import torch.distributed as dist
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(512, 512, bias=False) for _ in range(8)])
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        if wrap != "plain":
            model = DDP(model, gradient_as_bucket_view=wrap == "view")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(32, 512)
        tracker = MemTracker()
        tracker.track_external(model, opt, x)
        with tracker:
            for step in range(2):
                model(x).pow(2).mean().backward()
                opt.step()
                opt.zero_grad()
                if step == 0:
                    tracker.reset_mod_stats()
        peak = tracker.get_tracker_snapshot("peak")
    finally:
        dist.destroy_process_group()
    total = sum(v for dev in peak.values() for k, v in dev.items() if str(k) == "Total")
    return total, sum(p.numel() * p.element_size() for p in model.parameters())


def test_ddp_keeps_its_buckets_beside_the_gradients_unless_they_are_views():
    """DDP's default (gradient_as_bucket_view=False): the step's peak is the plain step's plus exactly the
    gradients' bytes, 8 x 512 x 512 x 4 B = 8,388,608 B (the buckets, made when the model is wrapped); as views, the
    buckets are the gradients, and the peak grows by less than that (the gradients then live from the start)."""
    plain, grads = _peak("plain")
    ddp, _ = _peak("ddp")
    view, _ = _peak("view")
    assert grads == 8_388_608
    assert ddp - plain == grads
    assert 0 <= view - plain < grads


def test_a_ddp_layout_counts_its_buckets_in_every_phase():
    """The estimate of Llama 3.2 1B at zero_stage 0 over 8 data-parallel ranks is one GPU's plus its whole bf16
    gradients (2,471,628,800 B) in the temporaries; over one rank, at ZeRO-1/2/3 or with tensor parallelism (not
    PyTorch's DDP) nothing is added."""
    arch = load_preset("llama-3.2-1b")
    whole = gradients_bytes(arch, get_precision("bf16"))
    assert whole == 2_471_628_800
    rows = [{C.DATA_PARALLEL: d, C.ZERO_STAGE: z, C.TENSOR_PARALLEL: t} for d, z, t in
            ((1, 0, 1), (8, 0, 1), (8, 1, 1), (8, 3, 1), (8, 0, 2))]
    frame = pd.DataFrame([{C.BATCH: 2, C.SEQ_LEN: 1024, C.PRECISION: "bf16", C.OPTIMIZER: "adamw",
                           C.OPTIMIZER_IMPL: "foreach", C.CHECKPOINTING: "none", C.ATTENTION: "flash",
                           C.CACHE_TOKENS: 0, C.DECODE_TOKENS: 0, C.GPU_MEMORY: 80 * 2**30, **r} for r in rows])
    est = estimate_frame(arch, "train", frame, Overheads(), 0.0)
    temp = est[C.TEMPORARY].to_numpy(dtype=np.int64)
    peak = est[C.PEAK_ALLOCATED].to_numpy(dtype=np.int64)
    assert peak[1] - peak[0] == whole and temp[1] - temp[0] == whole
    no_ddp = estimate_frame(arch, "train", frame.assign(**{C.DATA_PARALLEL: 1}), Overheads(), 0.0)
    # ZeRO stages and tensor parallelism change other states; the buckets are not among them
    for i in (2, 3, 4):
        assert (est[C.TEMPORARY].iloc[i] - no_ddp[C.TEMPORARY].iloc[i]) < whole // 2


def _frame(**cols) -> pd.DataFrame:
    return pd.DataFrame([{C.BATCH: 1, C.SEQ_LEN: 2048, C.PRECISION: "bf16", C.OPTIMIZER: "adamw",
                          C.OPTIMIZER_IMPL: "foreach", C.CHECKPOINTING: "none", C.ATTENTION: "flash",
                          C.CACHE_TOKENS: 0, C.DECODE_TOKENS: 0, C.GPU_MEMORY: 80 * 2**30, **cols}])


def test_ddp_bucket_views_are_the_gradients_kept_between_steps():
    """parallel.ddp_bucket_view (gradient_as_bucket_view=True): no second copy of the gradients, but they stay
    allocated from one step to the next, as zero_grad(set_to_none=False) keeps them: Llama 3.2 1B over 8 DDP ranks
    with bucket views is one GPU's step with zero_grad 'zeros' (measured: tests/data/truth, +17 % at b 1, s 2,048),
    at its peak; without views it is one GPU's step plus the buckets."""
    arch = load_preset("llama-3.2-1b")
    whole = gradients_bytes(arch, get_precision("bf16"))
    one = estimate_frame(arch, "train", _frame(), Overheads(), 0.0)
    zeros = estimate_frame(arch, "train", _frame(**{C.ZERO_GRAD: "zeros"}), Overheads(), 0.0)
    ddp = {view: estimate_frame(arch, "train", _frame(**{C.DATA_PARALLEL: 8, C.ZERO_STAGE: 0,
                                                         C.DDP_BUCKET_VIEW: view}), Overheads(), 0.0)
           for view in (False, True)}
    assert ddp[True][C.PEAK_ALLOCATED].iloc[0] == zeros[C.PEAK_ALLOCATED].iloc[0]
    assert ddp[False][C.PEAK_ALLOCATED].iloc[0] == one[C.PEAK_ALLOCATED].iloc[0] + whole
    # at this shape the step peaks at the loss, before any gradient: views save nothing there (both hold the whole
    # gradients once, as buckets or as kept .grad); they save where the peak is in the backward or the step
    assert ddp[True][C.PEAK_ALLOCATED].iloc[0] == ddp[False][C.PEAK_ALLOCATED].iloc[0]
    # at 512 tokens the optimizer step is the peak, where the gradients are live either way: views save the copy
    short = {view: estimate_frame(arch, "train", _frame(**{C.SEQ_LEN: 512, C.DATA_PARALLEL: 8, C.ZERO_STAGE: 0,
                                                           C.DDP_BUCKET_VIEW: view}), Overheads(), 0.0)
             for view in (False, True)}
    assert (short[False][C.PEAK_ALLOCATED] - short[True][C.PEAK_ALLOCATED]).iloc[0] == whole
    assert (short[True][C.PEAK_PHASE] == "optimizer").all()


def test_a_model_planned_from_its_code_under_ddp_reads_its_traced_plans():
    """Qwen3 0.6B (planned from its own code, the shipped CPU plans of its measured cases): over 8 DDP ranks its
    step is one GPU's plus its bf16 gradients once more (1,192,099,840 B); with bucket views it is the step traced
    with the gradients kept (the measured zero_grad 'zeros' case, tests/data/truth)."""
    import json
    from pathlib import Path

    from nnmem_sweep import accuracy as A
    from nnmem_sweep.derive import stored_only
    from nnmem_sweep.peak import estimate_components

    truth = Path(__file__).parent / "data" / "truth"
    case = json.loads((truth / "qwen3-0.6b-train-bf16-adamw-zerograd-b4-s2048.json").read_text())
    arch = A.architecture_of(case)
    base = A.case_frame(case)

    def peak(frame) -> int:
        with stored_only():
            return int(np.asarray(estimate_components(arch, "train", frame, device="cpu")[C.PEAK_ALLOCATED])[0])

    ddp = base.drop(columns=[C.ZERO_GRAD]).assign(**{C.DATA_PARALLEL: 8, C.ZERO_STAGE: 0})
    assert peak(ddp.assign(**{C.DDP_BUCKET_VIEW: True})) == peak(base)
    assert peak(ddp.assign(**{C.DDP_BUCKET_VIEW: False})) == peak(base.assign(**{C.ZERO_GRAD: "set_to_none"})) + \
        596_049_920 * 2
