"""The decision page (issue 14): the first page of every report, for someone who reads one page.

Its first lines answer the scenario's question: what was asked (model, mode, the target), the GPU type and count
that meets it with the recipe and layout, and the margin (GiB and % of usable memory); then every GPU type of the
scenario in a short table (fits or not, GPUs, margin, price, a throughput estimate), what would flip the answer
(verdicts whose margin is smaller than the uncertainty of the memory outside PyTorch and of fragmentation,
report/uncertainty.py, flagged "verify by measuring" with the command) and a one-line sensitivity. The options come
from decision_options.py; the throughput estimate from throughput/plan.py, each figure with what it assumed.

How the answer is chosen (ANSWER_RULE, printed on the page): GPU types that meet the question with the recipe asked
first, then those that need fewer changes of it; among those the lowest price when every GPU has one (cluster
scenarios: their rank_by), else the fewest GPUs, then the least memory per GPU; a cluster without prices, equal
counts: the shorter estimated time per 10⁹ tokens.
"""
from __future__ import annotations

import math
from typing import Any

import pandas as pd

from .. import columns as C
from ..scenario import Scenario
from ..serving import kv_element
from ..throughput.options import DEFAULTS as THROUGHPUT_DEFAULTS
from ..throughput.plan import has_tokens, serving_figures, training_figures
from . import decision_options as D
from .format import DASH, duration, gib, gib_number, percent, rate, signed_gib, usd
from .points import has_sequence
from .uncertainty import basis_text, flips, measure_command, uncertainty_bytes

VERIFY = "verify by measuring"


def _price_of(o: D.Option) -> tuple[float | None, str]:
    """(comparable price, its words) of an option: per hour first, then purchase; (None, '') without one."""
    g = o.gpu
    if g.price_usd_per_hour is not None:
        return g.price_usd_per_hour * o.gpus, f"{usd(g.price_usd_per_hour * o.gpus)}/h"
    if g.price_usd is not None:
        return g.price_usd * o.gpus, usd(g.price_usd * o.gpus)
    return None, ""


# ------------------------------------------------------------------------------------------------ the question

def _tokens_words(sc: Scenario, batch: int, seq: int) -> str:
    if not has_sequence(sc):
        return f"batch {batch:,}"
    if sc.model.kind == "derived" and sc.model.derived.source.preference:
        return (f"{batch:,} preference pair{'s' if batch != 1 else ''} of {seq:,} tokens ({2 * batch * seq:,} tokens "
                "per step: chosen and rejected)")
    return f"batch {batch:,} × {seq:,} tokens ({batch * seq:,} tokens per step)"


def question_text(sc: Scenario, q: D.Question) -> str:
    p, name = q.point, sc.model.name
    if q.kind == "cluster":
        s = sc.cluster
        return (f"Which GPUs, and how many, train {name} at {s.global_batch:,} sequences × {s.seq_len:,} tokens per "
                f"optimizer step ({s.global_batch * s.seq_len:,} tokens) with {p[C.PRECISION]} {p[C.OPTIMIZER]}?")
    recipe = D._recipe_words(sc, p)
    unset = "" if q.has_target else " (the report's reference point: the scenario sets no target)"
    if q.kind == "serving":
        t = int(p[C.TENSOR_PARALLEL])
        return (f"Which GPU serves {name} to {int(p[C.BATCH]):,} concurrent sequences of {int(p[C.CONTEXT]):,} tokens "
                f"({int(p[C.SEQ_LEN]):,}-token prompt + {int(p.get(C.DECODE_TOKENS) or 0):,} generated), "
                f"{p[C.PRECISION]} weights, KV cache {p[C.KV_DTYPE]}, "
                f"{'one GPU' if t == 1 else f'{t} GPUs (tensor parallel)'} per replica{unset}?")
    if sc.mode == "infer":
        return (f"Which GPU runs {name} inference for {int(p[C.BATCH]):,} sequences at once, each a "
                f"{int(p[C.SEQ_LEN]):,}-token prompt and {int(p.get(C.DECODE_TOKENS) or 0):,} generated tokens, with "
                f"{recipe} weights{unset}?")
    where = "" if sc.parallel else ", on one GPU"
    ft = getattr(sc.model, "finetune", None)
    trains = f"trains {name}" if ft is None or not ft.adapters else \
        f"fine-tunes {name} with {'QLoRA' if ft.method == 'qlora' else 'LoRA'} (rank {ft.rank})"
    return f"Which GPU {trains} at {_tokens_words(sc, int(p[C.BATCH]), int(p[C.SEQ_LEN]))} with {recipe}{where}{unset}?"


# ------------------------------------------------------------------------------------------------ throughput

def _speed(sc: Scenario, q: D.Question, o: D.Option) -> dict[str, Any] | None:
    """The option's throughput estimate: figures and the Assumptions they rest on (None: no tokens to count)."""
    if not has_tokens(sc.model) or not o.fits:
        return None
    opts = sc.throughput or THROUGHPUT_DEFAULTS
    r = o.row
    if q.kind == "cluster" or sc.mode == "train":
        seq = int(sc.cluster.seq_len) if q.kind == "cluster" else int(r[C.SEQ_LEN])
        f = training_figures(sc.model, o.gpu, str(r[C.PRECISION] if C.PRECISION in r else q.point[C.PRECISION]),
                             str(r[C.CHECKPOINTING]), seq, o.gpus, opts)
        return {"kind": "train", "per_gpu": f.tokens_per_s_per_gpu, "time": f.seconds_per_billion_tokens,
                "cost": f.cost_per_billion_tokens_usd, "assumed": [f.mfu], "dtype": f.compute_dtype}
    n = int(r[C.BATCH])
    top = o.extra.get("max_concurrent") if q.kind == "serving" else o.extra.get("max_batch")
    elem, scale = (kv_element(str(r[C.KV_DTYPE]), str(r[C.PRECISION])) if q.kind == "serving" else (None, 0))
    f = serving_figures(sc.model, o.gpu, str(r[C.PRECISION]), int(r[C.SEQ_LEN]), int(r.get(C.DECODE_TOKENS) or 0), n,
                        int(r.get(C.TENSOR_PARALLEL) or 1), elem, scale, top or None, opts)
    return {"kind": "infer", "per_seq": f.tokens_per_s_per_sequence, "aggregate": f.tokens_per_s,
            "at_max": f.tokens_per_s_at_max, "max": top, "ttft": f.ttft_s,
            "assumed": [f.bandwidth_efficiency, f.compute_efficiency]}


def _speed_cells(sc: Scenario, sp: dict[str, Any] | None, kind: str, priced: bool) -> list[str]:
    if not has_tokens(sc.model):
        return []
    if kind == "train":
        if sp is None:
            return [DASH, DASH] + ([DASH] if priced else [])
        mfu = sp["assumed"][0].value
        return ([f"{rate(sp['per_gpu'])} ({percent(mfu, 0)})", duration(sp["time"])]
                + ([usd(sp["cost"])] if priced else []))
    if sp is None:
        return [DASH, DASH, DASH]
    at_max = f"{rate(sp['at_max'])} at {sp['max']:,}" if sp["max"] else DASH
    return [rate(sp["per_seq"]), at_max, duration(sp["ttft"])]


def _speed_sentence(o: D.Option, sp: dict[str, Any] | None) -> str:
    if sp is None:
        return ""
    if not math.isfinite(sp.get("per_gpu", sp.get("per_seq", math.nan))):
        what = "peak FLOP/s" if sp["kind"] == "train" else "memory bandwidth and peak FLOP/s"
        return f"No throughput estimate for the {o.gpu.name}: the GPU catalog holds no {what} for it."
    if sp["kind"] == "train":
        mfu = sp["assumed"][0]
        where = f"on {o.gpus:,} GPUs" if o.gpus > 1 else "on one GPU"
        cost = f", {usd(sp['cost'])} per 10^9 tokens at the GPU's hourly price" if math.isfinite(sp["cost"]) else ""
        offload = str(o.row.get(C.OFFLOAD, "none")) != "none"
        return (f"Estimated speed (an estimate, not a measurement): {rate(sp['per_gpu'])} tokens/s per GPU at "
                f"{mfu.label()}, so {duration(sp['time'])} per 10^9 tokens {where}{cost}"
                + (" (an upper bound: the offload's host-device copies and CPU step are not timed)." if offload
                   else "."))
    bw, comp = sp["assumed"]
    at_max = f", {rate(sp['at_max'])} tokens/s together at {sp['max']:,} sequences" if sp["max"] else ""
    return (f"Estimated speed (an estimate, not a measurement): {rate(sp['per_seq'])} tokens/s per sequence while "
            f"{int(o.row[C.BATCH]):,} decode together ({rate(sp['aggregate'])} tokens/s in all){at_max}; time to "
            f"first token of one {int(o.row[C.SEQ_LEN]):,}-token prompt {duration(sp['ttft'])}; at {bw.label()} "
            f"and {comp.label()}.")


# ------------------------------------------------------------------------------------------------ the answer

def _answer_key(q: D.Question, o: D.Option, sp: dict[str, Any] | None, priced_all: bool) -> tuple:
    price = _price_of(o)[0] if priced_all else 0.0
    per_gpu = (sp or {}).get("per_gpu", math.nan)
    speed = -per_gpu * o.gpus if q.kind == "cluster" and math.isfinite(per_gpu) else 0.0
    return (len(o.changed), price, o.gpus, o.gpu.memory_bytes, speed)


def _choose(sc: Scenario, q: D.Question, opts: list[D.Option], speeds: list) -> int | None:
    fitting = [i for i, o in enumerate(opts) if o.fits]
    if not fitting:
        return None
    if q.kind == "cluster" and sc.cluster.rank_by == "cost_per_token":
        costs = [(speeds[i] or {}).get("cost", float("nan")) for i in fitting]
        known = [(c, opts[i].gpus, k, i) for k, (i, c) in enumerate(zip(fitting, costs)) if math.isfinite(c)]
        if known:
            return min(known)[3]
    priced_all = all(_price_of(opts[i])[0] is not None for i in fitting)
    return min(fitting, key=lambda i: (_answer_key(q, opts[i], speeds[i], priced_all), i))


def _closest(opts: list[D.Option]) -> int:
    return min(range(len(opts)), key=lambda i: (opts[i].total / max(opts[i].usable, 1), i))


def _option_words(sc: Scenario, q: D.Question, o: D.Option) -> str:
    if q.kind == "cluster":
        nodes = -(-o.gpus // sc.cluster.gpus_per_node)
        return f"{o.gpus:,} × {o.gpu.name} ({nodes:,} node{'s' if nodes != 1 else ''}) with {o.recipe}"
    count = f"{o.gpus:,} × " if o.gpus > 1 else ""
    return f"{count}{o.gpu.name} with {o.recipe}"


def _need_words(q: D.Question, o: D.Option) -> str:
    per = " per GPU" if o.gpus > 1 or q.kind == "cluster" else ""
    if q.kind == "serving":
        return (f"{o.extra['max_concurrent']:,} concurrent sequences fit ({int(o.row[C.BATCH]):,} asked) in the "
                f"{gib(o.usable)} the engine may use{per}")
    host = int(o.row.get(C.HOST) or 0)  # offloaded states (per node)
    host_words = f", and {gib(host)} of the node's {gib(int(o.row[C.HOST_MEMORY]))} host memory" \
        if host and C.HOST_MEMORY in o.row else ""
    return f"needs {gib_number(o.total)} of {gib(o.usable)} usable{per}{host_words}"


def _margin_words(q: D.Question, o: D.Option) -> str:
    pct = o.margin / o.usable if o.usable else 0.0
    room = "margin" if o.margin >= 0 else "short by"
    of = "of what the engine may use" if q.kind == "serving" else "of usable"
    return f"{room} {gib(abs(o.margin))} ({percent(abs(pct))} {of})"


def _sensitivity(sc: Scenario, q: D.Question, o: D.Option, plan: pd.DataFrame | None) -> str:
    checks = [D.fragmentation_sensitivity(o)]
    if q.kind == "cluster":
        checks.append(D.cluster_sensitivity(sc, o))
    elif q.kind == "serving":
        checks.append(D.serving_sensitivity(o, plan))
    elif has_sequence(sc):
        checks.append(D.grid_sensitivity(sc, o))
    words = []
    for c in (c for c in checks if c):
        need = (f"{c['max_concurrent']:,} sequences fit" if "max_concurrent" in c
                else f"needs {gib_number(c['total'])} of {gib(o.usable)}")
        if c["fits"] == o.fits:
            verb = "still fits" if o.fits else "still does not fit"
        else:
            verb = "no longer fits" if o.fits else "would fit"
        words.append(f"{verb} with {c['what']} ({need})" if c["what"].startswith("frag")
                     else f"{verb} at {c['what']} ({need})")
    return "Sensitivity: " + "; ".join(words) + "." if words else ""


# ------------------------------------------------------------------------------------------------ the page

def _headers(sc: Scenario, q: D.Question, priced: bool, hourly: bool) -> tuple[list[str], list[bool]]:
    """Column headings and which columns are numbers (no throughput columns for a model without tokens)."""
    price = ["price"] if priced else []
    speed = has_tokens(sc.model)
    train_speed = (["tokens/s per GPU (MFU), est.", "time per 10^9 tokens, est."] + (
        ["cost per 10^9 tokens, est."] if hourly else [])) if speed else []
    infer_speed = (["decode tokens/s per sequence, est.", "tokens/s at the most sequences, est.",
                    "first token, est."]) if speed else []
    if q.kind == "cluster":
        h = ["GPU", "verdict", "GPUs (nodes)", "layout", "need / usable per GPU (GiB)", "margin (GiB)"] + train_speed
    elif q.kind == "serving":
        h = ["GPU", "verdict", "GPUs", "recipe (* not as asked)", "sequences that fit", "KV margin (GiB)"] + infer_speed
    else:
        h = (["GPU", "verdict"] + (["GPUs"] if sc.parallel else []) + ["recipe (* not as asked)",
                                                                     "need / usable (GiB)", "margin (GiB)",
                                                                     "largest batch"]
             + (train_speed if sc.mode == "train" else infer_speed))
    h += price
    return h, [x not in ("GPU", "verdict", "layout") and not x.startswith("recipe") for x in h]


def _row_cells(sc: Scenario, q: D.Question, o: D.Option, sp: dict[str, Any] | None, flag: bool, priced: bool,
               hourly: bool) -> list[str]:
    verdict = ("fits" if o.fits else "no") + (f"; {VERIFY}" if flag else "")
    need = f"{gib_number(o.total)} / {gib_number(o.usable)}"
    price = [_price_of(o)[1] or DASH] if priced else []
    recipe = o.recipe + (" *" if o.changed else "")
    if q.kind == "cluster":
        nodes = -(-o.gpus // sc.cluster.gpus_per_node)
        return [o.gpu.name, verdict, f"{o.gpus:,} ({nodes:,})", recipe, need, signed_gib(o.margin)] \
            + _speed_cells(sc, sp, "train", hourly) + price
    if q.kind == "serving":
        return [o.gpu.name, verdict, f"{o.gpus:,}", recipe, f"{o.extra['max_concurrent']:,} of {int(o.row[C.BATCH]):,}",
                signed_gib(o.margin)] + _speed_cells(sc, sp, "infer", False) + price
    mb = o.extra.get("max_batch")
    cells = [o.gpu.name, verdict] + ([f"{o.gpus:,}"] if sc.parallel else []) + [
        recipe, need, signed_gib(o.margin), DASH if not mb else f"{mb:,}"]
    return cells + _speed_cells(sc, sp, sc.mode, hourly) + price


def assumed(speeds: list) -> list[tuple[str, str]]:
    """Every distinct assumption the throughput figures rest on: (label with its sources, how it follows)."""
    seen: dict[str, str] = {}
    for sp in speeds:
        for a in (sp or {}).get("assumed", []):
            seen.setdefault(a.label(), a.note)
    return list(seen.items())


def _assess(sc: Scenario, q: D.Question, opts: list[D.Option]) -> tuple[list, list, list]:
    """Per option: its throughput estimate, its uncertainty band (below, above) and whether that could flip it."""
    speeds = [_speed(sc, q, o) for o in opts]
    bands = [uncertainty_bytes({**o.row, C.PEAK_ALLOCATED: o.peak}, sc) for o in opts]
    return speeds, bands, [flips(o.margin, *band) for o, band in zip(opts, bands)]


def _band(below: int, above: int) -> str:
    """'−0.3 GiB to +2.0 GiB' (no sign on a side that is zero)."""
    return f"{'−' if below else ''}{gib(below)} to {'+' if above else ''}{gib(above)}"


def _safe(sc: Scenario, q: D.Question, opts: list[D.Option], cluster_options: pd.DataFrame | None) -> str:
    """When the answer's margin is within the uncertainty: the best choice whose margin is not."""
    pool = D.cluster_every_option(sc, cluster_options) if q.kind == "cluster" else opts
    speeds, bands, flagged = _assess(sc, q, pool)
    keep = [i for i, o in enumerate(pool) if o.fits and not flagged[i]]
    if not keep:
        return " No option listed has a margin beyond it."
    sub = [pool[i] for i in keep]
    i = _choose(sc, q, sub, [speeds[k] for k in keep])
    o, above = sub[i], bands[keep[i]][1]
    return (f" The best choice whose margin covers it: {_option_words(sc, q, o)} (margin {gib(o.margin)} against "
            f"+{gib(above)}).")


def decision(sc: Scenario, max_batch: pd.DataFrame, serving_plan: pd.DataFrame | None,
             cluster_options: pd.DataFrame | None, config_path: str) -> dict[str, Any]:
    """The page's context: the question, the answer and its margin, the table of every GPU type, the sensitivity,
    the uncertainty and the verdicts to verify, the notes (formatted strings; decision.html.j2 lays them out)."""
    q = D.question(sc, serving_plan, cluster_options)
    if q.kind == "cluster":
        opts = D.cluster_options(sc, cluster_options)
    elif q.kind == "serving":
        opts = D.serving_options(sc, q, serving_plan)
    else:
        opts = D.grid_options(sc, q, max_batch)
    speeds, bands, flagged = _assess(sc, q, opts)
    priced = any(_price_of(o)[1] for o in opts)
    hourly = any(o.gpu.price_usd_per_hour is not None for o in opts)
    headers, num = _headers(sc, q, priced, hourly)
    chosen = _choose(sc, q, opts, speeds)
    rows = [{"cells": _row_cells(sc, q, o, sp, f, priced, hourly),
             "class": " ".join(c for c, on in (("answer", i == chosen), ("nofit", not o.fits), ("flag", f)) if on)}
            for i, (o, sp, f) in enumerate(zip(opts, speeds, flagged))]
    out: dict[str, Any] = {"question": question_text(sc, q), "table": {"headers": headers, "num": num,
                                                                               "rows": rows},
                           "fits": chosen is not None, "detail": "", "speed": "", "sensitivity": "",
                           "uncertainty": "", "verify": [], "notes": [], "assumed": []}
    if not opts:
        out["answer"] = "Nothing to compare: no GPU of the scenario could be estimated."
        return out
    i = chosen if chosen is not None else _closest(opts)
    o, (below, above) = opts[i], bands[i]
    if chosen is not None:
        asked = "" if not o.changed else (f" (not the recipe asked: {', '.join(o.changed)}; the recipe asked fits "
                                          f"no GPU listed)")
        out["answer"] = f"{_option_words(sc, q, o)}{asked}."
        need = _need_words(q, o)
        out["detail"] = f"{need[:1].upper()}{need[1:]}: {_margin_words(q, o)}."
    else:
        out["answer"] = "No GPU listed meets it."
        out["detail"] = f"The closest: {_option_words(sc, q, o)}; it {_need_words(q, o)}: {_margin_words(q, o)}."
    within = flagged[i]
    verdict = (f"The margin is within it: {VERIFY}." + (_safe(sc, q, opts, cluster_options) if o.fits else "")
               if within else "The margin is larger: the verdict stands.")
    out["uncertainty"] = (f"What a real GPU adds beyond the estimate: {_band(below, above)} "
                          f"({basis_text({**o.row, C.PEAK_ALLOCATED: o.peak}, sc)}). {verdict}")
    out["verify"] = [{"gpu": opts[k].gpu.name,
                      "why": f"{'margin' if opts[k].fits else 'short by'} {gib(abs(opts[k].margin))}, within "
                             f"{_band(*bands[k])}",
                      "command": _command(sc, q, opts[k], config_path)} for k in range(len(opts)) if flagged[k]]
    out.update(speed=_speed_sentence(o, speeds[i]), sensitivity=_sensitivity(sc, q, o, serving_plan),
               notes=_notes(sc, q, speeds), assumed=assumed(speeds))
    return out


def _command(sc: Scenario, q: D.Question, o: D.Option, config_path: str) -> str:
    if q.kind == "cluster" or sc.parallel:
        return ("one training step of this layout on the GPUs themselves: torch.cuda.max_memory_reserved() on the "
                "most loaded rank plus the memory nvidia-smi shows outside it (nnmem-sweep measure runs one GPU, "
                "not a parallel layout)")
    if q.kind == "serving":
        return (f"start the serving engine on the GPU and compare the KV-cache tokens its start-up log reports with "
                f"the {o.extra['kv_tokens']:,} planned here")
    return f"{measure_command(config_path, sc, o.row)} (on the GPU itself)"


def _notes(sc: Scenario, q: D.Question, speeds: list) -> list[str]:
    if q.kind == "cluster":
        rule = ("the lowest estimated cost per 10^9 tokens trained (cluster.rank_by: cost_per_token), ties to the "
                "fewest GPUs" if sc.cluster.rank_by == "cost_per_token" else
                "per type its fewest GPUs (the layout by the rule of Cluster options); across types the lowest price "
                "when every GPU has one, else the fewest GPUs, then the shorter estimated time")
    elif q.kind == "serving":
        rule = ("per GPU the tensor parallelism, weights and KV cache asked, else the fewest changes of them; across "
                "GPUs the fewest changes, the lowest price when every GPU has one, else the fewest GPUs, the least "
                "memory")
    else:
        rule = ("per GPU the recipe asked, else the fewest changes of its settings, then the most room; across GPUs "
                "the fewest changes, the lowest price when every GPU has one, else the fewest GPUs, the least memory; "
                "nothing fitting: the smallest need / usable")
    basis = (f"judged by the serving plan (Serving capacity): the engine may use "
             f"{percent(float(sc.serving.get('gpu_memory_utilization', 0.9)))} of each GPU, the KV margin is what the "
             f"sequences asked leave of it" if q.kind == "serving" else
             f"margin = usable memory (the capacity PyTorch sees less {percent(sc.headroom)} headroom) minus the "
             f"estimate's total (peak allocated plus runtime overheads)")
    notes = [f"How the answer is chosen: {rule}; {basis}. GiB = 2^30 bytes; \"GB\" in a GPU's name is 10^9 bytes."]
    if any(speeds):
        what = ("MFU × the dense peak of the recipe's compute dtype / (6·N + 12·L·H·Q·T) FLOPs per token, the same "
                "MFU at any scale" if sc.mode == "train" else
                "a decode step reads the weights and each sequence's KV cache at the mean context, or computes, "
                "whichever is slower; first token = the prefill of one prompt")
        notes.append(f"Throughput figures are estimates ({what}) and change no memory figure. Assumed: "
                     + "; ".join(label for label, _ in assumed(speeds)) + ". How each follows from its sources: "
                     "Assumptions, Throughput estimate.")
        ft = getattr(sc.model, "finetune", None)
        if ft is not None and ft.adapters:
            notes.append("LoRA/QLoRA: the frozen base computes no weight gradients (about 4·N FLOPs per token, not "
                         "6·N), which the model FLOPs here still count: the estimate errs slow.")
    elif sc.model.kind == "derived" and sc.model.derived.source.preference:
        notes.append("No throughput estimate: a preference step's FLOPs (the policy on both sequences of each pair, "
                     "and the reference's forward) are not modelled yet.")
    elif not has_tokens(sc.model):
        notes.append("No throughput estimate: the model has no tokens to count FLOPs per token for.")
    return notes
