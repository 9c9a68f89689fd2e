"""Measure a case (measure_case): build its workload (workload/build.py) and record it under PyTorch's MemTracker
(tracker.PhaseTracker), with fake or real CPU tensors.

`fake=True` wraps construction and the run in FakeTensorMode so an 8B model costs no memory; `fake=False` runs real
tensors (tests/measure/test_method.py and test_families.py check the two agree byte for byte).
"""
from __future__ import annotations

import contextlib
from typing import Any

import torch

from ..workload.build import (build_model, build_optimizer, case_config, default_dtype, make_workload, model_dtype,
                              run_contexts, sharding)
from .tracker import run_workload


def measure_case(case: dict[str, Any], fake: bool = True) -> dict[str, Any]:
    """Measure one case; returns run_workload's record plus the config used."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    dtype = model_dtype(case.get("precision", "fp32"))
    mode_ctx = FakeTensorMode() if fake else contextlib.nullcontext()
    train = case["mode"] == "train"
    torch.manual_seed(0)
    cfg, origin = case_config(case)
    with sharding(case), mode_ctx:
        with default_dtype(dtype):
            model = build_model(case, cfg, fake)
            opt = build_optimizer(model, case["optimizer"], case.get("optimizer_impl", "foreach")) if train else None
            w = make_workload(case, cfg, model, opt)
        with run_contexts(case, fake):
            record = run_workload(w)
    record["config"] = cfg
    record["config_origin"] = origin
    record["input_kind"] = w.kind
    record["params"] = int(sum(p.numel() for p in {id(p): p for p in model.parameters()}.values()))
    if "finetune" in case:  # peft's own count (PeftModel.get_nb_trainable_parameters)
        record["trainable_params"] = int(model.get_nb_trainable_parameters()[0])
    return record
