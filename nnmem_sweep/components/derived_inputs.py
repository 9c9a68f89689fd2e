"""The inputs a derived frame reads (components/derived.py): each recipe's traced plan (derived now where no cache
or shipped plan holds it, in parallel processes first) and the model states beside it: W' the recipe's weights, and
the master copy, optimizer state and step temporaries from the catalogs, of the trainable tensors alone where the
base is frozen (peft's adapters)."""
from __future__ import annotations

import dataclasses

import numpy as np

from .. import columns as C
from .. import derive
from ..catalog.optimizers import get_optimizer
from ..catalog.precisions import Precision, get_precision
from ..citations import formula, source
from ..errors import UsageError
from .optimizer import optimizer_state_bytes, optimizer_step_temporary_bytes
from .weights import master_weights_bytes, weights_bytes

FSDP_OFFLOAD = source("torch-fsdp-offload", "PyTorch FSDP1 CPUOffload(offload_params=True) "
                      "(torch/distributed/fsdp/_flat_param.py: each flat parameter's local shard pinned on the CPU, "
                      "_cpu_grad beside it, the shard copied to the compute device in pre_unshard) and FSDP2 "
                      "CPUOffloadPolicy (_fully_shard/_fsdp_param.py all_gather_inputs, _fsdp_collectives.py "
                      "foreach_reduce: the sharded gradient copied to the CPU); the optimizer steps on the CPU",
                      "https://docs.pytorch.org/docs/stable/distributed.fsdp.fully_shard.html")
DERIVED = source("nnmem-derived", "nnmem_sweep derived plans: the model's own code traced under FakeTensorMode at "
                 "probe shapes, every allocation's bytes solved as an integer polynomial in (b, s) and checked at "
                 "shapes left out (nnmem_sweep/derive/)", "nnmem_sweep/derive/derivation.py")


def _plan(arch, mode: str, precision: str, attention: str, checkpointing: str, device: str, progress: bool,
          zero_grad: str = "set_to_none"):
    if checkpointing == "selective":
        raise UsageError("checkpointing 'selective' is Megatron's recipe (recompute attention only); a model derived "
                         "from its transformers code checkpoints whole layers: use none or full")
    try:
        return derive.get_plan(arch.derived.source, mode, precision, attention, checkpointing, device, progress,
                               zero_grad)
    except derive.DerivationError as e:
        raise UsageError(f"{_named(arch)}: {e}") from None


def _named(arch) -> str:
    """The model and where it was given (a user's config.json), for a one-line refusal."""
    origin = getattr(arch, "origin", "") or ""
    return f"{arch.name} ({origin})" if origin and origin not in arch.name else arch.name


def _prefetch(arch, requests: list, progress: bool) -> None:
    """The plans not stored yet, derived in parallel processes first (derive.prefetch)."""
    if any(r[3] == "selective" for r in requests):
        return  # refused one by one below
    try:
        derive.prefetch(arch.derived.source, requests, progress)
    except derive.DerivationError as e:
        raise UsageError(f"{_named(arch)}: {e}") from None


def recipe_weights(arch, plan, prec: Precision) -> int:
    """W': the traced parameters' bytes, or for quantised recipes the catalog's bytes of the card's tensors."""
    return weights_bytes(arch, prec) if prec.quant else plan.param_bytes


def _trainable_groups(arch, prec: Precision) -> list[tuple[object, Precision]]:
    """A derived model with a frozen base (peft's adapters): its trainable tensors as (an Architecture holding only
    them, the precision they follow), one per dtype: peft's LoRA tensors in fp32 (get_peft_model's
    autocast_adapter_dtype) unless the adapters keep the model's dtype, the rest (modules_to_save copies) in the
    model's. Every optimizer rule (state, step temporaries, master copy) then reads them as it reads a model."""
    card = arch.derived.card
    ft = arch.derived.source.finetune or {}
    fp32_adapters = ft.get("adapter_dtype", "fp32") == "fp32"
    groups = {}
    for t in card.tensors:
        if t.trainable:
            groups.setdefault(t.adapter and fp32_adapters, []).append(t)
    out = []
    for fp32, ts in groups.items():
        sub = dataclasses.replace(arch, derived=dataclasses.replace(
            arch.derived, card=dataclasses.replace(card, tensors=tuple(ts), params=sum(t.count * _numel(t) for t in ts))))
        out.append((sub, get_precision("fp32") if fp32 and prec.weight_bytes < 4 else prec))
    return out


def _numel(t) -> int:
    n = 1
    for d in t.shape:
        n *= d
    return n


@formula("derived_trainable_states", "M, S, T of the trainable tensors alone, per dtype group (fp32 adapters; "
         "modules_to_save in the model's dtype); T_forloop: the largest group's", DERIVED,
         where="peft get_peft_model (requires_grad only on adapters and modules_to_save; autocast_adapter_dtype)")
def trainable_states(arch, prec: Precision, opt, impl: str) -> tuple[int, int, int]:
    """(master copy, optimizer state, step temporaries) of a derived model whose base is frozen."""
    groups = _trainable_groups(arch, prec)
    M = sum(master_weights_bytes(a, p) for a, p in groups)
    S = sum(optimizer_state_bytes(a, p, opt, impl) for a, p in groups)
    temps = [optimizer_step_temporary_bytes(a, p, opt, impl) for a, p in groups]
    T = (max(temps, default=0) if impl == "forloop" else sum(temps))
    return M, S, T


def train_inputs(arch, precs: tuple[Precision, ...], o_names: tuple, i_names: tuple, a_names: tuple,
                 c_names: tuple, device: str, progress: bool = False, z_names: tuple = ()):
    """(recipes {code: plan}, states {W, M, S, T, G, B: arrays over state codes}) for the names of a training frame.
    Recipe code = (p, a, c[, z]) row-major (z: the zero_grad names when the frame has the column; "zeros" traces
    the step with the gradients kept); state code = (p, o, i, a, c) row-major (W' and G depend on the trace)."""
    nZ = max(len(z_names), 1)
    nP, nO, nI, nA, nC = len(precs), len(o_names), len(i_names), len(a_names), len(c_names)
    _prefetch(arch, [("train", p.name, a, c, device, z) for p in precs for a in a_names for c in c_names
                     for z in z_names or ("set_to_none",)], progress)
    recipes = {}
    shape = (nP, nO, nI, nA, nC)
    # B: DDP's allreduce buckets, none on one GPU (components/derived.py _read sets them for DDP's ranks); H: host
    # memory of an offloaded rank (offloaded_states), P: its traced host bytes
    states = {x: np.zeros(shape, dtype=np.int64) for x in ("W", "M", "S", "T", "G", "B", "H", "P")}
    for p_i, prec in enumerate(precs):
        for a_i, att in enumerate(a_names):
            for c_i, ck in enumerate(c_names):
                plan = _plan(arch, "train", prec.name, att, ck, device, progress)
                for z_i in range(nZ):  # the trace with the gradients kept: its own plan ("bf16+zeros", "bf16+nosync")
                    z = z_names[z_i] if z_names else "set_to_none"
                    recipes[((p_i * nA + a_i) * nC + c_i) * nZ + z_i] = \
                        plan if z == "set_to_none" else _plan(arch, "train", prec.name, att, ck, device, progress, z)
                states["W"][p_i, :, :, a_i, c_i] = recipe_weights(arch, plan, prec)
                states["G"][p_i, :, :, a_i, c_i] = plan.grad_bytes
                states["P"][p_i, :, :, a_i, c_i] = plan.host_bytes
        frozen = arch.derived.card.frozen
        states["M"][p_i] = master_weights_bytes(arch, prec)
        for o_i, o in enumerate(o_names):
            opt = get_optimizer(o)
            for i_i, impl in enumerate(i_names):
                if frozen:  # adapters: the optimizer sees the trainable tensors only
                    M, S, T = trainable_states(arch, prec, opt, impl)
                    states["M"][p_i] = M
                else:
                    S = optimizer_state_bytes(arch, prec, opt, impl)
                    T = optimizer_step_temporary_bytes(arch, prec, opt, impl)
                states["S"][p_i, o_i, i_i], states["T"][p_i, o_i, i_i] = S, T
    if (arch.derived.source.fsdp or {}).get("offload") == C.OFFLOAD_PARAMS:  # derive/arch.py sharded
        offloaded_states(states)
    del states["P"]
    return recipes, {k: v.ravel() for k, v in states.items()}


@formula("derived_fsdp_offload", "GPU: M = S = T_opt = G = 0 (W' the traced parameters left on the GPU);  host per "
         "rank: H + M + S + T_opt,  H = FSDP1: 2 · Σ flat-parameter shards; FSDP2: Σ shards + Σ trainable shards",
         FSDP_OFFLOAD,
         where="H: the shards and their CPU gradients (FSDP1 pins one per flat parameter, frozen ones too; FSDP2 "
               "copies the trainable ones' reduce-scattered gradients out); the master copy, optimizer state and "
               "step temporaries of the rank's trainable shards, stepped on the CPU",
         note="The GPU's side is the traced step (derive/step.py): the shards and CPU gradients host memory, each "
              "unit's shards copied to the GPU before its all-gather and freed once gathered.")
def offloaded_states(states: dict[str, np.ndarray]) -> None:
    """An FSDP rank offloading its parameters to the host (FSDP1's CPUOffload(offload_params=True), FSDP2's
    CPUOffloadPolicy): the optimizer steps the shards on the CPU, so the master copy, the optimizer state, the step
    temporaries and the gradients it reads are host memory (H), not the GPU's; in place."""
    states["H"] = states["P"] + states["M"] + states["S"] + states["T"]
    for x in ("M", "S", "T", "G"):
        states[x] = np.zeros_like(states[x])


def infer_inputs(arch, precs: tuple[Precision, ...], a_names: tuple, device: str, progress: bool = False):
    """(recipes {code: plan}, W' per code) for an inference frame; code = (p, a) row-major."""
    _prefetch(arch, [("infer", p.name, a, "none", device) for p in precs for a in a_names], progress)
    recipes, W = {}, []
    for p_i, prec in enumerate(precs):
        for a_i, att in enumerate(a_names):
            plan = _plan(arch, "infer", prec.name, att, "none", device, progress)
            recipes[p_i * len(a_names) + a_i] = plan
            W.append(recipe_weights(arch, plan, prec))
    return recipes, np.array(W, dtype=np.int64)
