"""The estimator against the committed measured cases (tests/data/truth/*.json); no torch needed.

`compare(cases)` puts, per case, the measured and the estimated peak_allocated_bytes (and the peak of each phase),
and the model states (weights, gradients, optimizer state) side by side with relative errors
(estimate − measured) / measured. The report's "Validation" section and tests/test_accuracy.py use it.
Each case is estimated with the device it was measured on (`device_for_estimate`: all committed cases ran on the
CPU, so device="cpu", which models CPU dropout's noise tensors and SDPA's math fallback); the GPU model ("cuda")
stays the default everywhere else.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from . import columns as C, published_compare
from .catalog.optimizers import get_optimizer
from .catalog.precisions import get_precision
from .components import derived as derived_plans, finetune as F
from .components.finetune_method import parse_finetune
from .components.optimizer import optimizer_state_bytes
from .components.weights import gradients_bytes, master_weights_bytes, param_summary, weights_bytes
from .derive import stored_only
from .derive.arch import architecture_from_source, peft_spec, with_adapters, with_preference
from .derive.cache import stack_text
from .derive.source import ModelSource
from .errors import UsageError
from .models.hf import architecture_from_hf
from .models.resolve import resolve_model
from .peak import estimate_components, named_phase_totals
from .parallel import deepspeed as DS
from .units import format_bytes

CASE = "case"
MEASURED = "measured_peak_bytes"
ESTIMATED = "estimated_peak_bytes"
ERROR = "error"  # relative: (estimated - measured) / measured
STATE_KINDS = ("weights", "gradients", "optimizer")
# Phases measured per mode, in order (the estimator's phase names).
PHASES = {"train": ("forward", "backward", "optimizer"), "infer": ("prefill", "decode")}


def hand_modelled_case(case: dict[str, Any]) -> bool:
    """True for a case whose model the estimator's own formulas describe: a layer list, or an HF config whose
    model_type models/hf.py reads. The other families (issue 12: OPT, Qwen3, T5, torchvision `module:` nets ...) are
    estimated from the model's own code by the derive package."""
    from .models.hf import supported_model_types

    inputs = case["inputs"]
    if "layers" in inputs:
        return True
    ft = inputs.get("finetune") or {}
    if "module" in inputs or ft.get("modules_to_save") or ft.get("method") == "qlora" or inputs.get("preference"):
        return False  # planned from the model's own code (components/finetune_method.py hand_modelled)
    if (ft or (inputs.get("fsdp") or {}).get("offload")) and inputs.get("fsdp"):
        # adapters sharded by FSDP, or FSDP1's CPU offload: its rank's step traced, as a scenario's (config_model.py)
        return False
    return (case.get("hf_config") or {}).get("model_type") in supported_model_types()


def load_cases(truth_dir: str | Path, derived: bool = True, sharded: bool = False) -> list[dict[str, Any]]:
    """Every *.json case in `truth_dir` and its subfolders, sorted by case id; without `derived`, only the
    hand-modelled ones (`hand_modelled_case`); the sharded steps (one rank of FSDP, truth/sharded/; of DeepSpeed's
    ZeRO engine, truth/deepspeed/) only with `sharded`, and then only those."""
    d = Path(truth_dir)
    if not d.is_dir():
        raise UsageError(f"no truth folder at {d}; regenerate it with `nnmem-sweep truth`")
    cases = []
    for p in sorted(d.rglob("*.json")):  # subfolders too: finetune/ holds the LoRA cases
        try:
            rec = json.loads(p.read_text())
        except json.JSONDecodeError as e:
            raise UsageError(f"{p}: not valid JSON ({e.msg} at line {e.lineno})") from None
        if "case_id" in rec and "measured" in rec and (derived or hand_modelled_case(rec)) and \
                bool(rec["inputs"].get("fsdp") or rec["inputs"].get("deepspeed")) == sharded:
            cases.append(rec)
    return sorted(cases, key=lambda r: r["case_id"])


def architecture_of(case: dict[str, Any], derived: bool = False):
    """The Architecture the estimator reads for a case: the very HF config that was measured, the layer list or the
    `module:` factory; planned from the model's own code (derive/) for the families without a hand model, and for
    any HF case with `derived` (to compare the two paths)."""
    inputs = case["inputs"]
    if "layers" in inputs:
        return resolve_model({"input_shape": inputs["input_shape"], "layers": inputs["layers"]}, Path("."))
    if derived or not hand_modelled_case(case):
        return derived_architecture(case)
    arch = architecture_from_hf(dict(case["hf_config"]), origin=f"truth case {case['case_id']}",
                                preset=str(inputs.get("model", "")))
    if inputs.get("finetune"):  # LoRA/QLoRA cases (truth/finetune/): the frozen base with its adapters
        arch = dataclasses.replace(arch, finetune=parse_finetune(inputs["finetune"], case["case_id"]))
    return arch


def derived_architecture(case: dict[str, Any]):
    """A case's model as the derive package plans it (its HF config, with the head the case ran, or its module)."""
    inputs = case["inputs"]
    if "module" in inputs:
        spec = {k: inputs[k] for k in ("module", "kwargs", "input_shape") if k in inputs}
        spec["num_classes"] = int((inputs.get("kwargs") or {}).get("num_classes", 1000))
        source = ModelSource.of("module", spec, f"truth case {case['case_id']}")
    else:
        cfg = dict(case["hf_config"])
        source = ModelSource.of("hf", cfg, f"truth case {case['case_id']}", int(inputs.get("decoder_seq_len") or 0))
    arch = architecture_from_source(source, name=str(inputs.get("model", "")))
    if inputs.get("finetune"):  # the same model with peft's adapters on it, traced so
        ft = parse_finetune(inputs["finetune"], case["case_id"])
        arch = with_adapters(arch, ft, peft_spec(ft))
    if inputs.get("preference"):  # trained on preference pairs (workload/preference.py)
        arch = with_preference(arch, inputs["preference"])
    return arch


def device_for_estimate(case: dict[str, Any]) -> str:
    """The estimator's device model for a case: the device it was measured on (the JSON's `device`, e.g.
    "cpu (FakeTensorMode)"), so CPU-only kernels (dropout noise in the input dtype, SDPA's math fallback when
    attention dropout > 0) are modelled as they ran. Exception: cases measured with `dropout_impl: native` route
    F.dropout to torch.native_dropout, the kernel CUDA runs (1-byte mask), so the GPU model ("cuda") is what ran."""
    if case["inputs"].get("dropout_impl") == "native":
        return "cuda"
    device = str(case.get("device") or "cpu").split()[0]
    return "cpu" if device == "cpu" else "cuda"


def attention_for_estimate(case: dict[str, Any]) -> str:
    """The attention mode the case asked for; with device="cpu" the estimator itself models CPU SDPA's fallback to
    the math path (dropout > 0), so the measured kernel ("math") is not mapped to another mode here."""
    return case["inputs"].get("attention", "flash")


def case_frame(case: dict[str, Any]) -> pd.DataFrame:
    i = case["inputs"]
    infer = i["mode"] == "infer"
    return pd.DataFrame({
        C.BATCH: [int(i["batch"])], C.SEQ_LEN: [max(int(i.get("seq_len") or 1), 1)], C.PRECISION: [i["precision"]],
        C.OPTIMIZER: ["none" if infer else i["optimizer"]],
        C.OPTIMIZER_IMPL: ["none" if infer else i.get("optimizer_impl", "foreach")],
        C.CHECKPOINTING: [i.get("checkpointing", "none")], C.ATTENTION: [attention_for_estimate(case)],
        C.CACHE_TOKENS: [0], C.DECODE_TOKENS: [int(i.get("decode_tokens") or 0)],
        # the optional axis only where the case ran it (columns.OPTIONAL_AXES)
        **({C.ZERO_GRAD: [i["zero_grad"]]} if "zero_grad" in i else {}),
        # micro-batches accumulated per optimizer step (one GPU): peak.one_gpu reads it
        **({C.GRADIENT_ACCUMULATION: [int(i["gradient_accumulation"])]} if "gradient_accumulation" in i else {}),
        **({C.GRADIENT_SYNC: [i["gradient_sync"]]} if "gradient_sync" in i else {}),
        # one rank of an FSDP step (FSDP1 or FSDP2): the layout the estimate reads (parallel/)
        **({C.DATA_PARALLEL: [int(i["fsdp"]["world"])], C.ZERO_STAGE: [int(i["fsdp"]["zero_stage"])],
            C.FSDP_VERSION: [fsdp_version(i)]} if i.get("fsdp") else {}),
        # FSDP1 without backward prefetch (workload/fsdp.py)
        **({C.BACKWARD_PREFETCH: [i["fsdp"]["backward_prefetch"]]} if (i.get("fsdp") or {}).get("backward_prefetch")
           else {}),
        # FSDP1's CPU offload (workload/fsdp.py)
        **({C.OFFLOAD: [i["fsdp"]["offload"]]} if (i.get("fsdp") or {}).get("offload") else {}),
        # one rank of a DeepSpeed ZeRO step: the layout and DeepSpeed's bucket settings (parallel/deepspeed.py)
        **(_deepspeed_axes(i["deepspeed"]) if i.get("deepspeed") else {}),
    })


def _deepspeed_axes(spec: dict[str, Any]) -> dict[str, list]:
    settings = {k: v for k, v in spec.items() if k in DS.KEYS}
    axes = DS.axes(settings, None)
    offload = {C.OFFLOAD: [spec["offload"]]} if spec.get("offload", "none") != "none" else {}
    return {C.DATA_PARALLEL: [int(spec["world"])], C.ZERO_STAGE: [int(spec["zero_stage"])],
            **{k: [v] for k, v in axes.items()}, **offload}


# torch.optim keeps each parameter's `step` as a 0-d fp32 tensor on the host unless the optimizer is fused or
# capturable (adam.py / adamw.py / adagrad.py / rmsprop.py / _adafactor.py, _init_group): a CUDA run's
# max_memory_allocated does not see these counters, which the estimator (a GPU model) leaves out; a CPU measurement
# counts them. They are added to the estimate of a CPU-measured case so both sides hold the same bytes.
HOST_STEP_OPTIMIZERS = ("adam", "adamw", "adafactor", "adagrad", "rmsprop")


def host_step_bytes(arch, inputs: dict[str, Any]) -> int:
    """4 bytes per trained parameter tensor for the optimizers above, outside fused implementations (0 otherwise).
    A hand-modelled LoRA case is left at 0 (tests/test_finetune.py states its counters itself)."""
    if inputs["mode"] != "train" or inputs.get("optimizer") not in HOST_STEP_OPTIMIZERS or \
            inputs.get("optimizer_impl", "foreach") == "fused" or (inputs.get("fsdp") or {}).get("offload") or \
            (inputs.get("deepspeed") or {}).get("offload", "none") != "none":
        return 0  # (an offloaded case's optimizer state is the host's, left out of its measured GPU side)
    if inputs.get("finetune"):
        if arch.kind != "derived":
            return 0
        return 4 * sum(t.count for t in arch.derived.card.tensors if t.trainable)
    if fsdp_version(inputs) == 1:  # one flat parameter per FSDP1 unit: the blocks, root
        return 4 * (arch.layers + 1)
    return 4 * param_summary(arch).n_tensors


def estimate_case(case: dict[str, Any], derived: bool = False) -> dict[str, Any]:
    """The estimator's figures for one measured case: peak, phase, components, per-phase totals, model states
    (`derived`: planned from the model's own code even where a hand model exists)."""
    arch = architecture_of(case, derived)
    i = case["inputs"]
    frame = case_frame(case)
    device = device_for_estimate(case)
    comps = estimate_components(arch, i["mode"], frame, device=device)
    host = host_step_bytes(arch, i) if str(case.get("device") or "cpu").startswith("cpu") else 0
    out: dict[str, Any] = {"peak_bytes": int(np.asarray(comps[C.PEAK_ALLOCATED])[0]) + host,
                           "peak_phase": str(np.asarray(comps[C.PEAK_PHASE])[0])}
    for c in C.COMPONENTS:
        v = comps.get(c, 0)
        out[c] = int(np.asarray(v)[0]) if np.ndim(v) else int(v)
    # per-phase maxima (the estimator may model one phase at several moments, e.g. backward start and end)
    phases: dict[str, int] = {}
    for name, total in named_phase_totals(arch, i["mode"], frame, device=device):
        t = int(np.asarray(total)[0])
        phases[name] = max(phases.get(name, -1), t + host if t >= 0 else t)
    out["phases"] = phases
    if C.HOST in comps:  # a layout offloading to the host: its bytes per node (gpus_per_node's default ranks)
        out["host_bytes_per_node"] = int(np.asarray(comps[C.HOST])[0])
    if i.get("fsdp") or i.get("deepspeed"):  # one rank's figures at its peak; its state totals are not compared (yet)
        out.update(weights=None, gradients=None, optimizer=None)
        return out
    prec = get_precision(i["precision"])
    if arch.kind == "derived" and (arch.derived.card.frozen or arch.derived.source.preference):
        # adapters on a derived model, or a preference step (a reference model's weights): the traced states
        _, states, _, code, *_ = derived_plans.frame_inputs(arch, i["mode"], frame, device)
        k = int(code[0])
        out["weights"] = int(states["W"][k] + states["M"][k])
        out["gradients"] = int(states["G"][k])
        out["optimizer"] = int(states["S"][k]) + host
        return out
    if arch.finetune is not None and arch.finetune.adapters:
        ft, opt, impl = arch.finetune, get_optimizer(i["optimizer"]), i.get("optimizer_impl", "foreach")
        out["weights"] = F.weights_bytes(arch, prec, ft) + F.master_weights_bytes(arch, prec, ft)
        out["gradients"] = F.gradients_bytes(arch, prec, ft)
        out["optimizer"] = F.optimizer_state_bytes(arch, prec, opt, impl, ft)
        return out
    out["weights"] = weights_bytes(arch, prec) + master_weights_bytes(arch, prec)
    if i["mode"] == "train":
        out["gradients"] = gradients_bytes(arch, prec)
        out["optimizer"] = optimizer_state_bytes(arch, prec, get_optimizer(i["optimizer"]),
                                                 i.get("optimizer_impl", "foreach")) + host
    return out


def _rel(est: float, meas: float) -> float:
    return (est - meas) / meas if meas else (0.0 if est == meas else float("inf"))


# Axes recorded per case in compare()'s output (with the value a case that omits it ran with).
COVERAGE_AXES = {C.PRECISION: "", C.OPTIMIZER: "none", C.OPTIMIZER_IMPL: "foreach", C.CHECKPOINTING: "none",
                 C.ATTENTION: "flash"}


def covered(table: pd.DataFrame | None, axis: str) -> set[str]:
    """The values of `axis` that at least one committed case within its tolerance exercises."""
    if table is None or axis not in table or "within_tolerance" not in table:
        return set()
    return set(table.loc[table["within_tolerance"].astype(bool), axis].astype(str))


def compare(cases: list[dict[str, Any]], derived: bool = False, trace: bool = False) -> pd.DataFrame:
    """One row per case: measured vs estimated peak (and per phase and per model state), relative errors,
    the case's tolerances and whether it is within them; `source` says which path estimated it (hand: the
    estimator's formulas; derived: the model's own traced code). `derived`: every HF case by the derived path.
    Derived plans come from the caches and the shipped plans (`make derive`); `trace`: derive missing ones now
    (minutes), else such a case is reported as not estimated."""
    with contextlib.nullcontext() if trace else stored_only():
        return _compare(cases, derived)


def fsdp_version(inputs: dict[str, Any]) -> int:
    """The FSDP version of a sharded case's step (its `fsdp.version`; 2, fully_shard, where not given)."""
    return int((inputs.get("fsdp") or {}).get("version", C.PARALLEL_DEFAULTS[C.FSDP_VERSION]))


def sharded_by(inputs: dict[str, Any]) -> str:
    """Which framework shards a case's step: "FSDP1", "FSDP2", "DeepSpeed" ("" for one GPU's)."""
    if inputs.get("deepspeed"):
        return "DeepSpeed"
    return f"FSDP{fsdp_version(inputs)}" if inputs.get("fsdp") else ""


def _compare(cases: list[dict[str, Any]], derived: bool) -> pd.DataFrame:
    rows = []
    for case in cases:
        m = case["measured"]
        i = case["inputs"]
        row: dict[str, Any] = {CASE: case["case_id"], "model": i.get("model", ""), C.MODE: i["mode"],
                               "source": "derived" if (derived and "layers" not in i) or not hand_modelled_case(case)
                               else "hand",
                               "attention_kernel": m.get("attention_kernel", ""),
                               "estimated_attention": attention_for_estimate(case),
                               "device": device_for_estimate(case), "measured_phase": m["peak_phase"],
                               MEASURED: int(m["peak_bytes"]),
                               "stack": stack_text(case.get("versions", {})),  # a figure holds for its stack
                               "sharded_by": sharded_by(i)}
        # the recipe the case exercises, so a report can say which of its own recipes a measurement covers
        row.update({axis: str(i.get(axis, default)) for axis, default in COVERAGE_AXES.items()})
        try:
            est = estimate_case(case, derived)
        except Exception as e:  # noqa: BLE001 - one case the estimator cannot take must not hide the others
            row.update({ESTIMATED: -1, ERROR: float("nan"), "estimated_phase": "", "estimate_error": str(e)})
            rows.append(row)
            continue
        row.update({ESTIMATED: est["peak_bytes"], ERROR: _rel(est["peak_bytes"], m["peak_bytes"]),
                    "estimated_phase": est["peak_phase"], "estimate_error": ""})
        # the transient part at the peak: measured act + temp + other (inputs) vs the estimate's
        # activations + kv_cache + temporary (the model states are compared on their own below)
        cats = m.get("categories_at_peak")  # none for a DeepSpeed rank (recorded, not MemTracker's categories)
        row["transient_measured_bytes"] = int(cats["act"] + cats["temp"] + cats["other"]) if cats else -1
        row["transient_estimated_bytes"] = int(est[C.ACTIVATIONS] + est[C.KV_CACHE] + est[C.TEMPORARY])
        for ph in PHASES[i["mode"]]:
            mp = m["phases"].get(ph, {}).get("peak_bytes")
            ep = est["phases"].get(ph, -1)
            row[f"{ph}_measured_bytes"] = -1 if mp is None else int(mp)
            row[f"{ph}_estimated_bytes"] = int(ep)
            row[f"{ph}_error"] = _rel(ep, mp) if (mp is not None and ep >= 0) else float("nan")
        totals = m["totals"]
        measured_states = {"weights": totals["param_bytes"] + totals.get("reference_bytes", 0),
                           "gradients": totals.get("grad_bytes"),
                           "optimizer": totals.get("optimizer_state_bytes")}
        for kind in STATE_KINDS:
            mv, ev = measured_states[kind], est.get(kind)
            row[f"{kind}_measured_bytes"] = -1 if mv is None else int(mv)
            row[f"{kind}_estimated_bytes"] = -1 if ev is None else int(ev)
            row[f"{kind}_error"] = _rel(ev, mv) if (mv is not None and ev is not None) else float("nan")
        tol = case.get("tolerance", {})
        row["peak_tolerance"] = float(tol.get("peak", 0.08))
        row["state_tolerance"] = float(tol.get("states", 0.001))
        rows.append(row)
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    state_err = df[[f"{k}_error" for k in STATE_KINDS]].abs().max(axis=1, skipna=True).fillna(0.0)
    df["within_tolerance"] = (df[ERROR].abs() <= df["peak_tolerance"]) & (state_err <= df["state_tolerance"])
    return df


def summary(df: pd.DataFrame) -> dict[str, float]:
    """Median and max |error| of peak_allocated_bytes over the cases the estimator could take."""
    e = df[ERROR].abs().dropna()
    return {"cases": int(len(df)), "estimated": int(len(e)),
            "median_abs_error": float(e.median()) if len(e) else float("nan"),
            "max_abs_error": float(e.max()) if len(e) else float("nan"),
            "within_tolerance": int(df.get("within_tolerance", pd.Series(dtype=bool)).sum())}


def format_table(df: pd.DataFrame) -> str:
    lines = [f"{'case':<62} {'device':<6} {'measured':>12} {'estimated':>12} {'error':>8}  phase (meas/est)  states"]
    for r in df.to_dict("records"):
        est = format_bytes(r[ESTIMATED], "GiB", 3) if r[ESTIMATED] >= 0 else "n/a"
        err = f"{r[ERROR]:+.1%}" if r[ERROR] == r[ERROR] else "n/a"
        states = " ".join(f"{k[0]}{r.get(f'{k}_error'):+.2%}" for k in STATE_KINDS
                          if r.get(f"{k}_error") == r.get(f"{k}_error") and r.get(f"{k}_error") is not None)
        lines.append(f"{r[CASE]:<62} {r.get('device', ''):<6} {format_bytes(r[MEASURED], 'GiB', 3):>12} {est:>12} "
                     f"{err:>8}  "
                     f"{r['measured_phase']}/{r.get('estimated_phase', '')}  {states}"
                     + (f"  [{r['estimate_error']}]" if r.get("estimate_error") else ""))
    return "\n".join(lines)


def accuracy_cli(truth_dir: str | Path) -> int:
    cases = load_cases(truth_dir)
    if not cases:
        raise UsageError(f"no measured cases in {truth_dir}; regenerate them with `nnmem-sweep truth`")
    df = compare(cases)
    print(format_table(df))
    for label, part in (("hand-modelled", df[df["source"] == "hand"]), ("derived from the model's code",
                                                                        df[df["source"] == "derived"])):
        if len(part):
            s = summary(part)
            print(f"\n{label}: {s['cases']} cases, {s['estimated']} estimated; peak_allocated_bytes |error|: median "
                  f"{s['median_abs_error']:.2%}, max {s['max_abs_error']:.2%}; {s['within_tolerance']} within "
                  "tolerance")
    print("\nmeasured with (a figure holds for its stack; the hand model is checked against these releases):")
    for stack, n in df["stack"].value_counts().sort_index().items():
        print(f"  {stack}: {n} cases")
    s = summary(df)
    print(f"\nall: {s['cases']} cases, {s['estimated']} estimated; peak_allocated_bytes |error|: median "
          f"{s['median_abs_error']:.2%}, max {s['max_abs_error']:.2%}; {s['within_tolerance']} within tolerance "
          "(target: median <= 3 %, max <= 8 %; weights, gradients, optimizer state within 0.1 %)")
    sharded = load_cases(truth_dir, sharded=True)
    if sharded:
        print("\none rank of sharded steps (FSDP2, truth/sharded/; DeepSpeed ZeRO-1/2, truth/deepspeed/):")
        print(format_table(compare(sharded)))
    pub = published_compare.compare_published()
    print("\npublished real-GPU measurements (tests/data/published), estimated with the same configuration:")
    print(published_compare.format_table(published_compare.estimated(pub)))
    print(f"\n{published_compare.summary_line(pub)}; not estimated: "
          f"{len(pub) - len(published_compare.estimated(pub))} (the source files' `missing`)")
    sys.stdout.flush()
    return 0
