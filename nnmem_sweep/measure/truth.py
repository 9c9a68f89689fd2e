"""Regenerate the committed truth: measure every catalog case and write tests/data/truth/<case_id>.json."""
from __future__ import annotations

import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

from ..paths import atomic_write_text, safe_stem
from .cases import DEEPSPEED_DIR, FINETUNE_DIR, SHARDED_DIR, case_by_id

# Keys of a case that describe its inputs (copied verbatim into the JSON).
INPUT_KEYS = ("model", "mode", "batch", "seq_len", "precision", "optimizer", "optimizer_impl", "checkpointing",
              "attention", "decode_tokens", "dropout_impl", "head", "layers", "input_shape", "num_classes", "finetune",
              "module", "kwargs", "decoder_seq_len", "zero_grad", "gradient_accumulation", "gradient_sync",
              "preference", "fsdp", "deepspeed")

METHOD = (
    "torch.distributed._tools.mem_tracker.MemTracker under FakeTensorMode on the cpu device, extended to keep a "
    "peak per phase (nnmem_sweep/measure/tracker.py). Random init, no download. Train: two steps of forward "
    "(loss only kept), backward, optimizer.step(), zero_grad(set_to_none=True); peak over both. Infer: no_grad, "
    "prefill with DynamicCache and logits_to_keep=1, then one-token decode steps, last-position logits upcast "
    "to fp32 as generate() does. No attention mask is passed (unpacked sequences; transformers' "
    "packed-sequence check answered None as a real run does). Categories are MemTracker's at the moment of the "
    "peak: param, buffer, grad, act (forward), temp (backward), opt (state and step() temporaries), other "
    "(inputs and labels). Optimizer 'step' scalars are counted (a CUDA run keeps them on the host unless "
    "capturable/fused)."
)


# What the workload adds for the input kinds beyond a causal LM (measure/inputs.py, tracker._run_infer); the cases of
# the hand-modelled families keep METHOD unchanged.
KIND_METHOD = {
    "seq2seq": " Encoder-decoder: train feeds input_ids and labels (the model shifts the labels right into "
               "decoder_input_ids); infer runs the encoder once and keeps its output, then the decoder on the start "
               "token (phase 'prefill', which spans both) and one-token decode steps, with an EncoderDecoderCache "
               "(self- and cross-attention K/V, totals split).",
    "image_cls": " Image classifier: pixel_values in the model's dtype and one label per image; infer is one no_grad "
                 "forward (phase 'forward').",
    "module": " torch.nn.Module factory (`module`, `kwargs`, random init, no weights): input x of shape "
              "(batch, *input_shape) in the model's dtype, cross-entropy against `num_classes` labels; infer is one "
              "no_grad forward (phase 'forward').",
}


# What a case with zero_grad "zeros" runs instead of zero_grad(set_to_none=True) (issue 13).
ZEROS_METHOD = (" zero_grad 'zeros': optimizer.zero_grad(set_to_none=False) after each step() instead, so from "
                "step 2 on the zeroed gradients are live through forward and backward accumulates into them.")


ACCUM_METHOD = (" Gradient accumulation: {n} forward and backward passes per optimizer step, the gradients of each "
                "accumulating into the ones before.")
NOSYNC_METHOD = (" FSDP2 set_requires_gradient_sync(False) before every micro-batch but the last (accelerate's "
                 "no_sync): the unsharded gradients accumulate, and only the last micro-batch reduce-scatters them.")


def method_text(kind: str, zero_grad: str = "set_to_none", accum: int = 1, grad_sync: str = "each") -> str:
    return METHOD + KIND_METHOD.get(kind, "") + (ZEROS_METHOD if zero_grad == "zeros" else "") + \
        (ACCUM_METHOD.format(n=accum) if accum > 1 else "") + (NOSYNC_METHOD if grad_sync == "last" else "")


def versions(kind: str = "", peft: bool = False) -> dict[str, str]:
    """torch, python and transformers versions (torchvision's for a `module:` case, which it builds; peft's for a
    case with adapters, which it wraps)."""
    import torch

    out = {"torch": torch.__version__, "python": platform.python_version()}
    if kind == "module":
        import torchvision

        out["torchvision"] = torchvision.__version__
    try:
        import transformers

        out["transformers"] = transformers.__version__
    except ImportError:  # pragma: no cover
        out["transformers"] = ""
    if peft:
        from ..derive.cache import installed

        out["peft"] = installed("peft")
    return out


def gpu_side(measured: dict[str, Any], version: int = 1) -> dict[str, Any]:
    """An FSDP step offloaded to the host, measured on one device, where host and GPU are one pool: the GPU's side of
    each phase is MemTracker's peak less what lives in host memory at that moment: the rank's shards (param_bytes,
    measured, less QLoRA's quant states, module state that stays on the GPU); `version` 1 (FSDP1's CPUOffload) a
    pinned CPU gradient of each one's size besides (_cpu_grad, zeros_like the shard: _flat_param.py), 2 (FSDP2's
    CPUOffloadPolicy) the gradients copied out by then (MemTracker's grad at that moment); and the optimizer state
    the CPU steps (MemTracker's opt). The optimizer phase runs on the host and is not a GPU figure: left out.
    MemTracker's own peak is kept beside each phase (pool_peak_bytes)."""
    totals = measured["totals"]
    shards = (2 if version == 1 else 1) * (int(totals["param_bytes"]) - int(totals.get("quant_state_bytes", 0)))
    phases = {}
    for name, m in measured["phases"].items():
        if name == "optimizer":
            continue
        host = shards + int(m["categories"].get("opt", 0)) + (int(m["categories"].get("grad", 0)) if version == 2
                                                              else 0)
        phases[name] = {**m, "peak_bytes": m["peak_bytes"] - host, "pool_peak_bytes": m["peak_bytes"],
                        "host_bytes": host}
    top = max(phases, key=lambda name: phases[name]["peak_bytes"])
    return {**measured, "phases": phases, "peak_bytes": phases[top]["peak_bytes"], "peak_phase": top,
            "peak_step": phases[top]["step"], "peak_module": phases[top]["module"], "peak_op": phases[top]["op"],
            "categories_at_peak": phases[top]["categories"],
            "totals": {**measured["totals"], "host_bytes": phases[top]["host_bytes"]}}


OFFLOAD_METHOD = (
    " CPUOffload(offload_params=True), as Answer.AI's FSDP-QLoRA and accelerate's fsdp_offload_params run it, on "
    "one device, two stand-ins for the host that fake tensors lack (workload/fsdp.py host_stand_ins: a fake tensor's "
    "pin_memory is itself, the CPU stream's synchronize a no-op): host and GPU are one pool there, so each phase's "
    "peak_bytes is MemTracker's (pool_peak_bytes) less the host's bytes at that moment (host_bytes: the rank's "
    "flat-parameter shards, a pinned CPU gradient of each one's size, the optimizer state; measure/truth.py "
    "gpu_side), and the optimizer phase, stepped on the host, is left out. The GPU's copy of each unit's shard "
    "before its all-gather is not made on one device (tests/data/truth/FINDINGS.md).")


def case_record(case: dict[str, Any], measured: dict[str, Any]) -> dict[str, Any]:
    """The JSON written for one case: inputs, measured figures, environment, method."""
    from ..workload import fsdp  # torch's side: measured already

    if fsdp.offloaded(case.get("fsdp")):
        measured = gpu_side(measured, fsdp.version(case["fsdp"]))
    rec: dict[str, Any] = {"case_id": case["id"]}
    rec["inputs"] = {k: case[k] for k in INPUT_KEYS if k in case}
    rec["tolerance"] = case["tolerance"]
    rec["hf_config"] = measured["config"] or None
    rec["hf_config_origin"] = measured["config_origin"]
    rec["params"] = measured["params"]
    if "trainable_params" in measured:
        rec["trainable_params"] = measured["trainable_params"]
    rec["measured"] = {
        "peak_bytes": measured["peak_bytes"],
        "peak_phase": measured["peak_phase"],
        "peak_step": measured["peak_step"],
        "peak_module": measured["peak_module"],
        "peak_op": measured["peak_op"],
        "categories_at_peak": measured["categories_at_peak"],
        "phases": measured["phases"],
        "totals": measured["totals"],
        "attention_kernel": measured["attention_kernel"],
        "attention_ops": measured["attention_ops"],
    }
    rec["versions"] = versions(measured.get("input_kind", ""), peft="finetune" in case)
    rec["device"] = "cpu (FakeTensorMode)"
    rec["method"] = method_text(measured.get("input_kind", ""), case.get("zero_grad", "set_to_none"),
                                int(case.get("gradient_accumulation", 1)), case.get("gradient_sync", "each"))
    if fsdp.version(case.get("fsdp")) == 1:
        strategy = "FULL_SHARD" if case["fsdp"]["zero_stage"] == 3 else "SHARD_GRAD_OP"
        orig = bool(case["fsdp"].get("use_orig_params"))
        wrapper = "the Hugging Face Trainer" if orig else "accelerate's FSDP plugin"
        rec["method"] += (f" Rank 0 of {case['fsdp']['world']} on PyTorch's fake process group, the model wrapped "
                          "with FSDP1's FullyShardedDataParallel per decoder block and at the root (use_orig_params "
                          f"{orig}, limit_all_gathers True, {strategy}, backward_prefetch "
                          f"{'None' if fsdp.prefetch(case['fsdp']) == 'none' else 'BACKWARD_PRE'}), the "
                          f"units {wrapper} makes by default; measured with MemTracker, the optimizer over the rank's "
                          f"{'views of its flat parameters' if orig else 'flat parameters'} (workload/fsdp.py "
                          "_shard_fsdp1).")
        if (case.get("finetune") or {}).get("method") == "qlora":
            rec["method"] += (" QLoRA as FSDP-QLoRA: bitsandbytes' quant storage in the model's dtype, which FSDP1 "
                              "can flatten, the rest of the model left in it (workload/qlora.py).")
        if case.get("finetune"):
            rec["method"] += (" Fake tensors keep the frozen root and first block unsharded after the backward: "
                              "FSDP1's catch-all reshard reads every fake data pointer (0) as its shard's "
                              "(tests/data/truth/FINDINGS.md).")
        if fsdp.offloaded(case["fsdp"]):
            rec["method"] += OFFLOAD_METHOD
    elif case.get("fsdp"):
        rec["method"] += (f" Rank 0 of {case['fsdp']['world']} on PyTorch's fake process group, the model wrapped "
                          "with FSDP2's fully_shard per decoder block and at the root (reshard after forward: "
                          f"{'yes' if case['fsdp']['zero_stage'] == 3 else 'no'}), measured with FSDPMemTracker; the "
                          "optimizer steps the rank's local shards (workload/fsdp.py).")
    return rec


DEEPSPEED_METHOD = (
    "One rank of DeepSpeed's own engine (deepspeed.initialize with bf16, ZeRO stage and reduce_bucket_size as given, "
    "DeepSpeed's other defaults; torch.optim.AdamW foreach handed to it) on one rank of PyTorch's fake process group "
    "under FakeTensorMode on the cpu device (workload/zero_engine.py). Recorded by nnmem_sweep's Recorder "
    "(derive/trace.py, MemTracker's counting of live untyped storages; MemTracker itself cannot follow the engine), "
    "from the storages held after one untraced step (parameters, buffers, fp32 partitions, optimizer state), "
    "through the second step's forward (loss only kept), engine.backward() and engine.step(). A FakeTensor holds "
    "no values: DeepSpeed's overflow and norm checks run and are answered 'finite', as a bf16 run with finite "
    "gradients answers them. Random init, no download; no attention mask (unpacked sequences).")


DEEPSPEED_OFFLOAD = (
    " ZeRO-Offload (zero_optimization.offload_optimizer: device cpu, pin_memory true; zero_force_ds_cpu_optimizer "
    "false, so torch's AdamW steps the host partition where DeepSpeedCPUAdam, a compiled op, would): every storage "
    "counted is the GPU's; the host's are told apart and never counted (workload/zero_engine.py host_side: the fp32 "
    "partition and its gradient, the pinned 16-bit copy and gradient buffer, the accumulated gradients, the optimizer state, "
    "whatever the torch step makes), their bytes in totals.host_bytes; master_bytes and opt_bytes are the host's.")


DEEPSPEED_METHOD_REAL = (
    "One rank of DeepSpeed's own engine (deepspeed.initialize with bf16, ZeRO stage and reduce_bucket_size as given, "
    "DeepSpeed's other defaults; torch.optim.AdamW foreach handed to it) on rank 0 of PyTorch's fake process group "
    "with real tensors on the cpu device (ZeRO-3 does not partition fake ones), rank 0 holding its partition only "
    "(workload/zero_engine.py). Recorded by nnmem_sweep's Recorder (derive/trace.py, MemTracker's counting of live "
    "untyped storages; MemTracker itself cannot follow the engine), from the storages held after one untraced step "
    "(persistent parameters, the 16-bit partitions, buffers, fp32 partitions, optimizer state), through the second "
    "step's forward (loss only kept), engine.backward() and engine.step(). Random init (seed 0), no download; no "
    "attention mask (unpacked sequences).")


def deepspeed_record(case: dict[str, Any]) -> dict[str, Any]:
    """Measure a DeepSpeed case (measure/zero_step.py) on its end ranks (per_rank) and return its JSON record."""
    from ..derive.cache import installed
    from ..workload.build import case_config
    from .zero_step import measure

    cfg, origin = case_config(case)
    world = int(case["deepspeed"]["world"])
    fake = int(case["deepspeed"]["zero_stage"]) < 3
    by_rank = per_rank(measure, case, cfg)
    measured = worst_rank(by_rank)
    method = DEEPSPEED_METHOD if fake else DEEPSPEED_METHOD_REAL
    if case["deepspeed"].get("offload", "none") != "none":
        method += DEEPSPEED_OFFLOAD
    if len(by_rank) > 1:
        method += DEEPSPEED_RANKS.format(last=world - 1)
    return {"case_id": case["id"], "inputs": {k: case[k] for k in INPUT_KEYS if k in case},
            "tolerance": case["tolerance"], "hf_config": cfg, "hf_config_origin": origin,
            "params": measured.pop("params"), "measured": measured,
            "versions": {**versions(), "deepspeed": installed("deepspeed")},
            "device": "cpu (FakeTensorMode)" if fake else "cpu (real tensors)", "method": method}


# A fresh run's first two steps on each end rank of a DeepSpeed ZeRO-1/2 case, as the allocator model replays them
# (derive/zero_rows.end_rank_sequences): the evidence of the reserve DeepSpeed's steps need (replays.DEEPSPEED_RESERVE_SPAN)
SEQUENCES_DIR = "sequences"


def sequence_path(folder: Path, case_id: str, rank: int) -> Path:
    return folder / f"{safe_stem(case_id)}-rank{rank}.npz"


def write_sequences(case: dict[str, Any], folder: Path) -> list[Path]:
    """Each end rank's fresh sequence, with an H100's two cuBLAS workspaces (derive/zero_rows.end_rank_sequences: a
    process of its own each), compressed."""
    import io

    import numpy as np

    from ..components.runtime import large_cublas_workspace_bytes
    from ..derive.zero_rows import end_rank_sequences
    from ..paths import atomic_write_bytes

    out = []
    for rank, events in end_rank_sequences(case, large_cublas_workspace_bytes()).items():
        buf = io.BytesIO()
        np.savez_compressed(buf, events=events)
        out.append(atomic_write_bytes(sequence_path(folder, case["id"], rank), buf.getvalue()))
    return out


DEEPSPEED_RANKS = (
    " ZeRO-1/2 cut one flat buffer into the ranks' partitions, so their steps differ: rank 0 (the start: the "
    "embedding) and rank {last} (the end: the last layers and an untied head, whose gradients come first, so its "
    "gradient partition is made at the backward's first bucket) are each measured in a process of their own; "
    "`measured` is per phase the larger of the two (every rank must fit), `measured.ranks` each one's.")


def per_rank(fn, case: dict[str, Any], cfg: dict[str, Any]) -> dict[int, Any]:  # noqa: ANN001
    """{rank: fn(the case at that rank, cfg)} over end_ranks, each in a process of its own: DeepSpeed keeps its process
    groups at module level, past the fake group's lifetime."""
    import multiprocessing

    out = {}
    for rank in end_ranks(case):
        at_rank = {**case, "deepspeed": {**case["deepspeed"], "rank": rank}}
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            out[rank] = pool.apply(fn, (at_rank, cfg))
    return out


def end_ranks(case: dict[str, Any]) -> tuple[int, ...]:
    """The ranks a DeepSpeed case measures: ZeRO-1/2 the two ends of the flat buffer (0 and the last); ZeRO-3, whose
    every parameter is cut evenly over the ranks, rank 0 (with real tensors, each rank costs minutes)."""
    from ..derive import zero_rows

    return (0,) if int(case["deepspeed"]["zero_stage"]) == 3 else zero_rows.end_ranks(case)


def worst_rank(by_rank: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """One record of several ranks' (zero_step.measure): per phase the rank with the larger peak (its start with
    it), the peak the largest of those, `totals` rank 0's; `ranks`: each rank's phases where there are several."""
    first = by_rank[min(by_rank)]
    phases = {name: max((r["phases"][name] for r in by_rank.values()), key=lambda ph: ph["peak_bytes"])
              for name in first["phases"]}
    peak_phase = max(phases, key=lambda p: phases[p]["peak_bytes"])
    out = {"params": first["params"], "peak_bytes": phases[peak_phase]["peak_bytes"], "peak_phase": peak_phase,
           "phases": phases, "totals": first["totals"]}
    if len(by_rank) > 1:
        out["ranks"] = {str(rank): r["phases"] for rank, r in sorted(by_rank.items())}
    return out


DEEPSPEED_INSTALL = "pip install deepspeed==0.19.8 (DS_BUILD_OPS=0: no compiler, no CUDA needed)"


def _with_deepspeed(ids: list[str], catalog: dict[str, dict[str, Any]], asked: bool) -> list[str]:
    """`ids` as they can be measured here: the DeepSpeed cases need DeepSpeed, which the [measure] extra does not
    install; asked for by name without it, one line; in a whole regeneration, left as committed (said on stderr)."""
    from ..derive.cache import installed
    from ..errors import UsageError

    ds = [i for i in ids if "deepspeed" in catalog[i]]
    if not ds or installed("deepspeed"):
        return ids
    if asked:
        raise UsageError(f"{ds[0]} runs DeepSpeed's engine, which is not installed: {DEEPSPEED_INSTALL}")
    print(f"{len(ds)} DeepSpeed case(s) left as committed (DeepSpeed not installed: {DEEPSPEED_INSTALL})",
          file=sys.stderr)
    return [i for i in ids if i not in ds]


def regenerate(out_dir: Path, only: list[str]) -> int:
    from .build import measure_case

    catalog = case_by_id()
    unknown = [c for c in only if c not in catalog]
    if unknown:
        from ..errors import UsageError

        raise UsageError(f"unknown truth case(s): {', '.join(unknown)}; see nnmem_sweep/measure/cases.py")
    ids = only or list(catalog)
    ids = _with_deepspeed(ids, catalog, asked=bool(only))
    out_dir = Path(out_dir)
    for i, cid in enumerate(ids, 1):
        t0 = time.perf_counter()
        case = catalog[cid]
        if "deepspeed" in case:
            rec = deepspeed_record(case)
            measured = rec["measured"]
        else:
            rec = case_record(case, measure_case(case, fake=True))
            measured = rec["measured"]
        folder = out_dir / SHARDED_DIR if "fsdp" in case else out_dir / DEEPSPEED_DIR if "deepspeed" in case else \
            out_dir / FINETUNE_DIR if ("finetune" in case or "preference" in case) else out_dir
        path = folder / f"{safe_stem(cid)}.json"
        atomic_write_text(path, json.dumps(rec, indent=1, sort_keys=False) + "\n")
        if "deepspeed" in case and case["deepspeed"]["zero_stage"] < 3:
            write_sequences(case, folder / SEQUENCES_DIR)
        print(f"[{i}/{len(ids)}] {cid}: peak {measured['peak_bytes']:,} B in {measured['peak_phase']} "
              f"({measured.get('attention_kernel', 'sdpa')} attention) {time.perf_counter() - t0:.1f} s -> {path}",
              file=sys.stderr, flush=True)
    return 0
