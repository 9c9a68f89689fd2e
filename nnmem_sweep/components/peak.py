"""The peak of a training step or an inference request, as a moment: the largest of a few phase totals.

Training (the modelled step is step 2: optimizer state exists; zero_grad(set_to_none=True) freed the grads):

    forward         W + M + S + saved activations + forward temporaries (logits, fp32 copy, log_softmax)
    backward start  W + M + S + saved activations + loss-backward temporaries; or + the last layer's MLP
                    backward; or + one recomputed layer (checkpointing): each a moment of its own
    backward end    W + M + S + G + inputs + gradient of the embedding output (+ the tied embedding's second
                    gradient and their sum, a moment of its own)
    optimizer       W + M + S + G + inputs + the step's temporaries

During backward the saved activations shrink layer by layer while the gradients grow by the same layers' weights,
so the live total moves roughly linearly between the two backward moments and its maximum is at one of them.
The component columns are those of the winning phase, so they add up to the peak exactly; ties go to the earlier
phase. params models follow the simple calculators' convention: one moment holding weights, master, gradients,
optimizer state and activations together (FORMULAS.md worked examples). Layer nets get a forward moment, one
backward moment per layer (what layers up to it still keep, the gradients of the layers after it) and the step.

Inference (generate() with a dynamic cache, or a preallocated cache of cache_tokens tokens):

    prefill         W + KV(prompt) + max(one layer's intermediates for the prompt, last-position logits
                    (or, with prefill_logits="all", every position's logits))
    decode          W + KV(prompt + decode_tokens) + the cache append copy + one token's intermediates,
                    or + the last step's logits (two moments)

Everything that depends only on the model and on the names in the grid (precisions, optimizers, ...) is a plan,
built once per (architecture, mode, device, names) and cached: per phase and component, the five Term coefficients
of every combination of names. A call reads the columns, forms one combination code per row, evaluates every phase
total, takes the winner per row (np.argmax over the phases) and evaluates the winner's components.

What lives where: this module holds the plan machinery (_Plan, _TermTable, _Rows, the plan cache), the plans of
one GPU (training, inference of layer nets and params models, the transformer inference tables and phases), the
entry points (estimate_components, phase_totals, phase_totals_in_batch, named_phase_totals, host_check) and their
dispatch (_prepare, _infer_any). Frames with parallel columns (issue 4) are handed to parallel/plan.py: the
training plan over parallel layouts and inference on each layout's rank model.
"""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd

from .. import columns as C
from ..catalog.optimizers import get_optimizer
from ..catalog.precisions import Precision, get_precision
from ..errors import UsageError
from ..models.arch import Architecture
from . import activations as act
from . import finetune
from .kv import cache_tokens, kv_append_temp_bytes, kv_cache_bytes
from .optimizer import optimizer_state_bytes, optimizer_step_temporary_bytes
from .terms import Term
from .weights import gradients_bytes, master_weights_bytes, param_summary, weights_bytes
# parallel/plan.py (the plans of frames with layouts) is imported where it is used: it imports this module. These
# two are imported here, as before that split, for the formulas they register (citations.all_formulas).
from ..parallel import activations as par_act  # noqa: F401
from ..parallel import layout as par_layout
from ..parallel import states as par_states  # noqa: F401
from ..units import parse_size

PHASES = ("forward", "backward", "optimizer", "prefill", "decode")
_PLAN_CACHE_SIZE = 64


# ---------------------------------------------------------------- reading the frame

def _ints(frame: pd.DataFrame, col: str) -> np.ndarray:
    return frame[col].to_numpy(dtype=np.int64)


def _codes(frame: pd.DataFrame, col: str) -> tuple[np.ndarray, tuple]:
    """Integer codes and their values for a (categorical or plain) column."""
    v = frame[col]
    if isinstance(v.dtype, pd.CategoricalDtype):
        return v.cat.codes.to_numpy(), tuple(v.cat.categories)
    codes, uniques = pd.factorize(v, sort=False)
    return codes, tuple(uniques)


def _combine(codes: list[np.ndarray], sizes: tuple[int, ...]) -> np.ndarray:
    """One code per row (intp, the take index) for the combination of names, row-major over `sizes` (axes of one
    name add nothing)."""
    live = [(c, m) for c, m in zip(codes, sizes) if m > 1]
    if not live:
        return np.zeros(len(codes[0]), dtype=np.intp)
    if len(live) == 1:
        return live[0][0].astype(np.intp)
    return np.ravel_multi_index([c for c, _ in live], [m for _, m in live])


# ---------------------------------------------------------------- coefficient tables

def _vec(terms: list[Term], shape: tuple[int, ...]) -> np.ndarray:
    """Terms as an int64 array (*shape, 5): const, pos, seq, tok, s2."""
    return np.array([(t.const, t.pos, t.seq, t.tok, t.s2) for t in terms], dtype=np.int64).reshape(*shape, 5)


def _consts(values: list[int], shape: tuple[int, ...]) -> np.ndarray:
    out = np.zeros((*shape, 5), dtype=np.int64)
    out[..., 0] = np.array(values, dtype=np.int64).reshape(shape)
    return out


def _features(b: np.ndarray, s: np.ndarray) -> list:
    """The row factor of each Term coefficient: const · 1, pos · s, seq · b, tok · b·s, s2 · b·s²."""
    bs = b * s
    return [None, s, b, bs, bs * s]


class _Table:
    """m Terms per index, from an (N, m, 5) coefficient array: eval(idx, x) gives, for every row r,
    const + s·pos + b·seq + (b·s)·tok + (b·s²)·s2 of Term j at index idx[r], as an (m, rows) int64 array. Integer
    arithmetic in int64, so exact (the bound check in bounds.py keeps every total far below 2^63). Each coefficient
    is evaluated only for the Terms where it is not zero at some index."""

    def __init__(self, arr: np.ndarray):
        self.m = arr.shape[1]
        self.coef = []  # (coefficient, the Terms that use it, their table: (len(terms), N))
        for f in range(arr.shape[2]):
            terms = np.flatnonzero(arr[..., f].any(axis=0))
            if len(terms):
                self.coef.append((f, terms, np.ascontiguousarray(arr[:, terms, f].T)))

    def eval(self, idx: np.ndarray, x: list) -> np.ndarray:
        out = np.zeros((self.m, len(idx)), dtype=np.int64)
        for f, terms, table in self.coef:
            part = table.take(idx, axis=1)
            if x[f] is not None:
                part *= x[f]
            out[terms] += part
        return out


class _TermTable(_Table):
    """One Term per combination code (transformer inference): eval gives one value per row, `coefficient(f)` the
    per-code coefficient f (0 const ... 4 s2)."""

    def __init__(self, terms: list[Term]):
        arr = _vec(terms, (len(terms), 1))
        super().__init__(arr)
        self.arr = arr[:, 0]

    def eval(self, idx: np.ndarray, b: np.ndarray, s: np.ndarray) -> np.ndarray:
        return super().eval(idx, _features(b, s))[0]

    def coefficient(self, f: int) -> np.ndarray:
        return self.arr[:, f]


class _Plan:
    """Phases of a step over every combination of the names on `axes` (sizes `sizes`, row-major): per phase and
    component the Term coefficients of every combination. A call evaluates every phase total, takes the winner per
    row (np.argmax: the first phase on ties) and evaluates the winner's components."""

    def __init__(self, axes: tuple[str, ...], sizes: tuple[int, ...], phases: list[tuple[str, dict]]):
        self.axes, self.sizes = axes, sizes
        self.nk = int(np.prod(sizes))
        self.names = names = [p[0] for p in phases]
        # totals: (combination, phase, 5)
        self.totals = _Table(np.stack([sum(comps.values()).reshape(-1, 5) for _, comps in phases], axis=1))
        # components of each phase: (phase · combination, component, 5); a single phase keeps only its own
        self.comp_names = list(phases[0][1]) if len(phases) == 1 else list(C.COMPONENTS)
        zero = np.zeros((self.nk, 5), dtype=np.int64)
        self.comps = _Table(np.concatenate([np.stack([pc[c].reshape(-1, 5) if c in pc else zero
                                                      for c in self.comp_names], axis=1) for _, pc in phases]))
        uniq = list(dict.fromkeys(names))
        self.label = np.array([uniq.index(p) for p in names], dtype=np.int8)
        self.dtype = pd.CategoricalDtype(uniq)
        self.host: np.ndarray | None = None  # parallel plans: host bytes per rank, per combination
        self.seq_divisor: np.ndarray | None = None  # parallel plans: s_l = s / divisor, per layout

    def phase_totals(self, k: np.ndarray, b: np.ndarray, s: np.ndarray) -> np.ndarray:
        """(phases, rows) totals."""
        return self.totals.eval(k, _features(b, s))

    def pick(self, k: np.ndarray, b: np.ndarray, s: np.ndarray) -> dict[str, object]:
        """Components of the winning phase, peak_allocated_bytes and peak_phase."""
        x = _features(b, s)
        totals = self.totals.eval(k, x)
        win = np.argmax(totals, axis=0)  # first phase on ties
        out: dict[str, object] = dict(zip(self.comp_names, self.comps.eval(win * self.nk + k, x)))
        out[C.PEAK_ALLOCATED] = totals.max(axis=0)  # the winner's total
        out[C.PEAK_PHASE] = pd.Categorical.from_codes(self.label[win], dtype=self.dtype)
        return out


def _lift(arr: np.ndarray, dims: tuple[int, ...], sizes: tuple[int, ...]) -> np.ndarray:
    """A (*sizes of dims, 5) array spread over every combination of `sizes` (dims ascending)."""
    shape = [sizes[i] if i in dims else 1 for i in range(len(sizes))]
    return np.broadcast_to(arr.reshape(*shape, 5), (*sizes, 5))


# ---------------------------------------------------------------- plans, cached per (architecture, names)

_PLANS: dict[tuple, tuple[Architecture, object]] = {}


def _cached(arch: Architecture, key: tuple, build):
    """build() once per (architecture object, key). Keyed by identity (a frozen Architecture can be large to hash);
    the entry keeps the architecture alive, so its id cannot be reused while the entry stands."""
    full = (id(arch), *key)
    hit = _PLANS.get(full)
    if hit is not None and hit[0] is arch:
        return hit[1]
    plan = build()
    if len(_PLANS) >= _PLAN_CACHE_SIZE:
        _PLANS.clear()
    _PLANS[full] = (arch, plan)
    return plan


@functools.lru_cache(maxsize=256)
def _precisions(names: tuple, mode: str) -> tuple[Precision, ...]:
    precs = [get_precision(n) for n in names]
    if mode == "train":
        bad = [p.name for p in precs if p.infer_only]
        if bad:
            raise UsageError(f"precision {', '.join(bad)} stores quantised weights for inference only; "
                             "use mode: infer or a training recipe (fp32, bf16, fp16, bf16-mixed, fp16-mixed, bf16-master)")
    return tuple(precs)


def _states(arch: Architecture, precs: tuple[Precision, ...], o_names: tuple, i_names: tuple):
    """Model states: W, M, G per precision; optimizer state and step temporaries per (precision, optimizer,
    impl); as (nP, 5) and (nP, nO, nI, 5) coefficient arrays."""
    opts = [get_optimizer(o) for o in o_names]
    nP, nO, nI = len(precs), len(opts), len(i_names)
    W = _consts([weights_bytes(arch, p) for p in precs], (nP,))
    M = _consts([master_weights_bytes(arch, p) for p in precs], (nP,))
    G = _consts([gradients_bytes(arch, p) for p in precs], (nP,))
    S = _consts([optimizer_state_bytes(arch, p, o, i) for p in precs for o in opts for i in i_names], (nP, nO, nI))
    T = _consts([optimizer_step_temporary_bytes(arch, p, o, i) for p in precs for o in opts for i in i_names],
                (nP, nO, nI))
    return W, M, G, S, T


def _train_plan(arch: Architecture, device: str, p_names: tuple, o_names: tuple, i_names: tuple,
                a_names: tuple = (), c_names: tuple = ()) -> _Plan:
    precs = _precisions(p_names, "train")
    ft = arch.finetune or finetune.FULL
    if ft.adapters:  # LoRA / QLoRA: frozen base, adapters trained (components/finetune.py)
        W, M, G, S, T_opt = finetune.finetune_states(arch, ft, precs, o_names, i_names)
    else:
        W, M, G, S, T_opt = _states(arch, precs, o_names, i_names)
    nP, nO, nI = len(precs), len(o_names), len(i_names)
    if arch.kind != "transformer":
        sizes = (nP, nO, nI)
        w, m, g = (_lift(x, (0,), sizes) for x in (W, M, G))
        states = {C.WEIGHTS: w, C.MASTER_WEIGHTS: m, C.OPTIMIZER_STATE: S}
        if arch.kind == "params":
            A = _lift(_vec([act.params_activations(arch, p) for p in precs], (nP,)), (0,), sizes)
            phases = [("backward", dict(states, **{C.GRADIENTS: g, C.ACTIVATIONS: A}))]
        else:
            phases = _layer_net_train(arch, precs, device, states, g, T_opt, sizes)
        return _Plan((C.PRECISION, C.OPTIMIZER, C.OPTIMIZER_IMPL), sizes, phases)

    nA, nC = len(a_names), len(c_names)
    sizes = (nP, nO, nI, nA, nC)
    w, m, g = (_lift(x, (0,), sizes) for x in (W, M, G))
    s_, t_opt = (_lift(x, (0, 1, 2), sizes) for x in (S, T_opt))
    states = {C.WEIGHTS: w, C.MASTER_WEIGHTS: m, C.OPTIMIZER_STATE: s_}
    terms = [finetune.train_activations(arch, p, a, c, ft, device) for p in precs for a in a_names for c in c_names]

    def table(ts: list[Term]) -> np.ndarray:  # per (precision, attention, checkpointing)
        return _lift(_vec(ts, (nP, nA, nC)), (0, 3, 4), sizes)

    saved = table([t.saved for t in terms])
    inputs = table([t.inputs for t in terms])
    fwd_tmp = table([t.forward_temp for t in terms])
    n_bwd = max(len(t.backward_start_temp) for t in terms)
    # each backward moment its own phase: a max of affine terms is not affine in batch
    bwd_start = [table([t.backward_start_temp[j] if j < len(t.backward_start_temp) else Term() for t in terms])
                 for j in range(n_bwd)]
    n_end = max(len(t.backward_end_temp) for t in terms)
    bwd_end = [table([t.backward_end_temp[j] if j < len(t.backward_end_temp) else Term() for t in terms])
               for j in range(n_end)]
    phases = [
        ("forward", dict(states, **{C.ACTIVATIONS: saved, C.TEMPORARY: fwd_tmp})),
        *[("backward", dict(states, **{C.ACTIVATIONS: saved, C.TEMPORARY: t})) for t in bwd_start],
        *[("backward", dict(states, **{C.GRADIENTS: g, C.ACTIVATIONS: inputs, C.TEMPORARY: t})) for t in bwd_end],
        ("optimizer", dict(states, **{C.GRADIENTS: g, C.ACTIVATIONS: inputs, C.TEMPORARY: t_opt})),
    ]
    return _Plan((C.PRECISION, C.OPTIMIZER, C.OPTIMIZER_IMPL, C.ATTENTION, C.CHECKPOINTING), sizes, phases)


def _layer_net_train(arch, precs, device, states, G, T_opt, sizes, grads_share=None):
    """Layer nets: forward end, one backward moment per layer (those not dominated by another), optimizer.
    grads_share (parallel layouts): the rank's gradient bytes per combination; each moment's gradients are then
    that share of the whole model's."""
    nets = [act.layer_net_train(arch, p, device) for p in precs]
    nP = len(precs)

    def table(ts: list[Term]) -> np.ndarray:  # per precision
        return _lift(_vec(ts, (nP,)), (0,), sizes)

    saved = table([t.saved for t in nets])
    inputs = table([t.inputs for t in nets])
    fwd = table([t.forward_temp for t in nets])
    phases = [("forward", dict(states, **{C.ACTIVATIONS: saved + inputs, C.TEMPORARY: fwd}))]
    # a moment is dominated when another has at least its batch-independent and its per-sample bytes everywhere
    keys = [[(g + a.const + t.const, a.seq + t.seq) for g, a, t in net.backward] for net in nets]
    keep = [j for j in range(len(keys[0]))
            if not any(all(kk[i][0] >= kk[j][0] and kk[i][1] >= kk[j][1] and kk[i] != kk[j] for kk in keys)
                       for i in range(len(keys[0])))]
    for j in dict.fromkeys(keep):
        grads = _lift(_consts([net.backward[j][0] for net in nets], (nP,)), (0,), sizes)
        if grads_share is not None:  # ⌈moment's bytes · rank's gradient bytes / whole model's⌉, per combination
            full = _lift(_consts([gradients_bytes(arch, p) for p in precs], (nP,)), (0,), sizes)
            num = grads.astype(object) * grads_share.astype(object)  # Python ints: the product can pass 2^63
            grads = (-((-num) // np.maximum(full, 1).astype(object))).astype(np.int64)
        a = table([net.backward[j][1] for net in nets])
        t = table([net.backward[j][2] for net in nets])
        phases.append(("backward", dict(states, **{C.GRADIENTS: grads, C.ACTIVATIONS: a, C.TEMPORARY: t})))
    phases.append(("optimizer", dict(states, **{C.GRADIENTS: G, C.ACTIVATIONS: inputs, C.TEMPORARY: T_opt})))
    return phases


def _infer_plan(arch: Architecture, p_names: tuple) -> _Plan:
    """Models other than transformers: one forward moment, weights and activations."""
    precs = _precisions(p_names, "infer")
    nP = len(precs)
    fn = act.params_activations if arch.kind == "params" else act.layer_net_infer
    W = _consts([weights_bytes(arch, p) for p in precs], (nP,))
    A = _vec([fn(arch, p) for p in precs], (nP,))
    return _Plan((C.PRECISION,), (nP,), [("forward", {C.WEIGHTS: W, C.ACTIVATIONS: A})])


class _InferTables:
    """Transformer inference: per precision the activation element size and the autocast weight copy; per
    (precision, attention) the prefill moments (attention, MLP, logits; two more with prefill_logits="all")."""

    def __init__(self, arch: Architecture, p_names: tuple, a_names: tuple, logits: str = "last"):
        precs = _precisions(p_names, "infer")
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
        self.moments = [_TermTable([t[j] for t in pre_terms]) for j in range(len(pre_terms[0]))]
        self.dtype = pd.CategoricalDtype(["prefill", "decode"])


# ---------------------------------------------------------------- entry points

def estimate_components(arch: Architecture, mode: str, frame: pd.DataFrame, device: str = "cuda", *,
                        prefill_logits: str = "last") -> dict[str, object]:
    """Component columns, peak_allocated_bytes and peak_phase for every row of `frame` (the grid axes).
    device="cpu" models what a CPU run keeps (dropout noise tensors instead of bool masks): for comparing with the
    CPU-measured ground truth only. prefill_logits (infer): "last" as generate() (logits_to_keep=1), "all" for a
    prefill that computes the logits of every prompt position."""
    plan, k, b, s = _prepare(arch, mode, frame, device, prefill_logits=prefill_logits)
    if plan is None:
        return _pick(*_infer_any(arch, frame, k, b, s), len(frame))
    out = plan.pick(k, b, s)
    if plan.host is not None:
        out[C.HOST], out[C.HOST_FITS] = _host(plan, k, frame)
    return out


def _host(plan: _Plan, k: np.ndarray, frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Host bytes per node (per rank x GPUs per node) and whether the node's RAM holds them."""
    n = len(k)
    gpn = _ints(frame, C.GPUS_PER_NODE) if C.GPUS_PER_NODE in frame.columns else \
        np.full(n, par_layout.DEFAULT_GPUS_PER_NODE, dtype=np.int64)
    ram = _ints(frame, C.HOST_MEMORY) if C.HOST_MEMORY in frame.columns else \
        np.full(n, parse_size(par_layout.DEFAULT_HOST_MEMORY), dtype=np.int64)
    host = plan.host[k] * gpn
    return host, host <= ram


def host_check(arch: Architecture, mode: str, frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray] | None:
    """(host bytes per node, host fits) for frames with parallel columns (batch-independent), else None."""
    if mode != "train" or not par_layout.has_parallel_columns(frame):
        return None
    plan, k, _, _ = _prepare(arch, mode, frame, "cuda", read_batch=False)
    return _host(plan, k, frame) if plan.host is not None else None


def phase_totals(arch: Architecture, mode: str, frame: pd.DataFrame, device: str = "cuda", *,
                 prefill_logits: str = "last") -> list[np.ndarray]:
    """The total of every phase for every row (-1 where a phase does not happen): affine in batch each."""
    plan, k, b, s = _prepare(arch, mode, frame, device, prefill_logits=prefill_logits)
    if plan is None:
        return _infer_any(arch, frame, k, b, s)[0]
    return list(plan.phase_totals(k, b, s))


def phase_totals_in_batch(arch: Architecture, mode: str, frame: pd.DataFrame, device: str = "cuda", *,
                          prefill_logits: str = "last"):
    """phase_totals as a function of the batch: `f(b) -> list of per-phase totals` for the rows of `frame` (whose
    batch column, if any, is ignored). The columns are read and the plan looked up once (fit.py calls it often)."""
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
    b = _ints(frame, C.BATCH) if read_batch else None
    s = _ints(frame, C.SEQ_LEN)
    p_code, p_names = _codes(frame, C.PRECISION)
    if mode == "train":
        _precisions(p_names, mode)  # checked before any other column is read
        o_code, o_names = _codes(frame, C.OPTIMIZER)
        i_code, i_names = _codes(frame, C.OPTIMIZER_IMPL)
        codes = [p_code, o_code, i_code]
        names: tuple = (p_names, o_names, i_names)
        if arch.kind == "transformer":
            a_code, a_names = _codes(frame, C.ATTENTION)
            c_code, c_names = _codes(frame, C.CHECKPOINTING)
            codes += [a_code, c_code]
            names += (a_names, c_names)
        if par_layout.has_parallel_columns(frame):
            from ..parallel import plan as par_plan  # it imports this module: imported here, at use

            return par_plan._prepare_train(arch, mode, frame, device, codes, names, b, s)
        plan = _cached(arch, ("train", device, *names), lambda: _train_plan(arch, device, *names))
        return plan, _combine(codes, plan.sizes), b, s
    if mode == "infer":
        if par_layout.has_parallel_columns(frame):  # tensor and pipeline parallel inference: a rank's model
            from ..parallel import plan as par_plan  # it imports this module: imported here, at use

            key = par_plan._infer_key(arch, mode, frame, p_code, p_names, prefill_logits)
            if key is not None:
                return None, key, b, s
        if arch.kind != "transformer":
            plan = _cached(arch, ("infer", p_names), lambda: _infer_plan(arch, p_names))
            return plan, p_code.astype(np.int64), b, s
        _precisions(p_names, mode)
        a_code, a_names = _codes(frame, C.ATTENTION)
        tables = _cached(arch, ("infer-tables", p_names, a_names, prefill_logits),
                         lambda: _InferTables(arch, p_names, a_names, prefill_logits))
        return None, (tables, p_code.astype(np.int64), a_code), b, s
    _precisions(p_names, mode)
    raise UsageError(f"unknown mode {mode!r}; use train or infer")


def _pick(phase_totals: list[np.ndarray], phase_components: list[dict[str, np.ndarray]],
          phase_names: list[str], n: int) -> dict[str, object]:
    """Components of the phase with the largest total (first one on ties); a component a phase does not hold is 0
    there."""
    stacked = np.stack(phase_totals)
    win = np.argmax(stacked, axis=0)[None]
    out: dict[str, object] = {}
    for comp in C.COMPONENTS:
        per_phase = np.stack([np.broadcast_to(pc.get(comp, 0), (n,)) for pc in phase_components])
        out[comp] = np.take_along_axis(per_phase, win, axis=0)[0]
    out[C.PEAK_ALLOCATED] = np.take_along_axis(stacked, win, axis=0)[0]  # the winner's total
    uniq = list(dict.fromkeys(phase_names))
    labels = np.array([uniq.index(p) for p in phase_names], dtype=np.int8)
    out[C.PEAK_PHASE] = pd.Categorical.from_codes(labels[win[0]], dtype=pd.CategoricalDtype(uniq))
    return out


def _infer_any(arch, frame, key, b, s):
    """_infer_phases, or for a frame with parallel layouts parallel/plan.py's _infer_layouts (each layout on its
    rank's model)."""
    if key[0] != "parallel":
        return _infer_phases(arch, frame, key, b, s)
    from ..parallel import plan as par_plan  # it imports this module: imported here, at use

    return par_plan._infer_layouts(arch, frame, key, b, s)


def _infer_phases(arch, frame, key, b, s):
    """Transformer inference: prefill and two decode moments, (totals, components, names)."""
    tb, p_code, a_code = key
    W = tb.W[p_code]
    e = tb.e[p_code]
    cast = tb.cast[p_code]
    cache = _ints(frame, C.CACHE_TOKENS)
    dec = _ints(frame, C.DECODE_TOKENS)
    static = cache > 0
    t_prefill = np.where(static, cache, s)
    t_final = np.where(static, cache, s + dec)
    k = p_code * tb.nA + a_code
    moments = tb.moments
    pre = np.maximum.reduce([m.eval(k, b, s) for m in moments]) + cast
    kv_pre = kv_cache_bytes(arch, b, t_prefill, e)
    # a decode step is the same moments for one token; eager attention scores span the whole cache
    one = np.ones_like(s)
    s2 = moments[0].coefficient(4)[k]
    scores = s2 * b * cache_tokens(arch, t_final)
    layer_step = np.maximum(moments[0].eval(k, b, one) - b * s2 + scores, moments[1].eval(k, b, one))
    append = np.where(static, 0, kv_append_temp_bytes(arch, b, t_final, e))  # the cat copy of one layer's K
    d_layer = layer_step + cast + append
    d_logits = moments[2].eval(k, b, one)
    kv_dec = kv_cache_bytes(arch, b, t_final, e)
    happens = dec > 0
    totals = [W + kv_pre + pre]
    comps = [{C.WEIGHTS: W, C.KV_CACHE: kv_pre, C.TEMPORARY: pre}]
    for temp in (d_layer, d_logits):
        totals.append(np.where(happens, W + kv_dec + temp, -1))
        comps.append({C.WEIGHTS: W, C.KV_CACHE: kv_dec, C.TEMPORARY: temp})
    return totals, comps, ["prefill", "decode", "decode"]
