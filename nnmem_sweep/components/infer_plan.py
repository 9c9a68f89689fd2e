"""Inference on one GPU (components/plan.py): the plan of layer nets and params models, and the phases of a
transformer's generate() request, evaluated directly (their decode moments depend on the cache, not only on b and s).

Transformers (generate() with a dynamic cache, or a preallocated cache of cache_tokens tokens):

    prefill         W + KV(prompt) + max(one layer's intermediates for the prompt, last-position logits
                    (or, with prefill_logits="all", every position's logits))
    decode          W + KV(prompt + decode_tokens) + the cache append copy + one token's intermediates,
                    or + the last step's logits (two moments)

Layer nets and params models: one forward moment, weights and activations. parallel/plan.py runs infer_phases on
each parallel layout's rank model.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .. import columns as C
from ..models.arch import Architecture
from . import activations as act
from .kv import cache_tokens, kv_append_temp_bytes, kv_cache_bytes
from .plan import Plan, TermTable, consts, ints, precisions, terms_array
from .weights import param_summary, weights_bytes


def infer_plan(arch: Architecture, p_names: tuple) -> Plan:
    """Models other than transformers: one forward moment, weights and activations."""
    precs = precisions(p_names, "infer")
    nP = len(precs)
    fn = act.params_activations if arch.kind == "params" else act.layer_net_infer
    W = consts([weights_bytes(arch, p) for p in precs], (nP,))
    A = terms_array([fn(arch, p) for p in precs], (nP,))
    return Plan((C.PRECISION,), (nP,), [("forward", {C.WEIGHTS: W, C.ACTIVATIONS: A})])


class InferTables:
    """Transformer inference: per precision the activation element size and the autocast weight copy; per
    (precision, attention) the prefill moments (attention, MLP, logits; two more with prefill_logits="all")."""

    def __init__(self, arch: Architecture, p_names: tuple, a_names: tuple, logits: str = "last"):
        precs = precisions(p_names, "infer")
        self.W = np.array([weights_bytes(arch, p) for p in precs], dtype=np.int64)
        # the LM head (or the embedding, the same shape), 16-bit even in quantised recipes: the part a pipeline
        # stage holds only one of
        self.head_bytes = np.array([arch.vocab * arch.hidden * max(p.weight_bytes, 2) for p in precs],
                                   dtype=np.int64)
        self.e = np.array([p.act_bytes for p in precs], dtype=np.int64)
        # autocast (mixed recipes) casts each fp32 matmul weight to 16 bit as it is used: one largest copy at a time
        self.cast = np.array([param_summary(arch).largest * p.act_bytes if p.autocast else 0 for p in precs],
                             dtype=np.int64)
        self.nA = len(a_names)
        pre_terms = [act.prefill_temp(arch, p, a, logits) for p in precs for a in a_names]
        # attention, MLP, last-position logits (and with prefill_logits="all" lm_head's output over every position,
        # then those logits beside the fp32 copy); a decode step uses the first three
        self.moments = [TermTable([t[j] for t in pre_terms]) for j in range(len(pre_terms[0]))]


def infer_phases(arch: Architecture, frame: pd.DataFrame, key: tuple, b: np.ndarray, s: np.ndarray):
    """Transformer inference: prefill and two decode moments, (totals, components, names). `key`: (InferTables,
    precision code, attention code) per row."""
    tb, p_code, a_code = key
    W = tb.W[p_code]
    e = tb.e[p_code]
    cast = tb.cast[p_code]
    cache = ints(frame, C.CACHE_TOKENS)
    dec = ints(frame, C.DECODE_TOKENS)
    static = cache > 0
    t_prefill = np.where(static, cache, s)
    t_final = np.where(static, cache, s + dec)
    k = p_code * tb.nA + a_code
    moments = tb.moments
    pre = np.maximum.reduce([m.eval(k, b, s) for m in moments]) + cast
    kv_pre = kv_cache_bytes(arch, b, t_prefill, e)
    # a decode step is the same moments for one token, except that what grows with s² (eager attention scores,
    # b·s2 per key; a mask shared by the batch, sq per key) spans every cached token, not one
    one = np.ones_like(s)
    cached = cache_tokens(arch, t_final)

    def step(m) -> np.ndarray:
        return m.eval(k, b, one) + (b * m.coefficient("s2")[k] + m.coefficient("sq")[k]) * (cached - 1)

    layer_step = np.maximum(step(moments[0]), step(moments[1]))
    append = np.where(static, 0, kv_append_temp_bytes(arch, b, t_final, e))  # the cat copy of one layer's K
    d_layer = layer_step + cast + append
    d_logits = step(moments[2])
    kv_dec = kv_cache_bytes(arch, b, t_final, e)
    happens = dec > 0
    totals = [W + kv_pre + pre]
    comps = [{C.WEIGHTS: W, C.KV_CACHE: kv_pre, C.TEMPORARY: pre}]
    for temp in (d_layer, d_logits):
        totals.append(np.where(happens, W + kv_dec + temp, -1))
        comps.append({C.WEIGHTS: W, C.KV_CACHE: kv_dec, C.TEMPORARY: temp})
    return totals, comps, ["prefill", "decode", "decode"]
