"""Model states per GPU: weights, master copy, gradients, optimizer state and the step's temporaries on one rank.

Split of the parameters (Megatron-LM, Shoeybi et al. 2019 §3; Narayanan et al. 2021):
    replicated      norms, biases of row-parallel linears (o_proj, down_proj), the MoE router, learned positions
    TP-sharded      attention and MLP matrices, biases of column-parallel linears, vocab-parallel embedding/lm_head
    expert          MoE experts: num_experts / ep experts per rank, each TP-sharded
    pipeline        ceil(L / p) layers per stage; the embedding on the first stage, the final norm and head on the
                    last (a tied embedding is a second copy there, as Megatron keeps it)
Sharding over data parallel d (ZeRO, Rajbhandari et al. 2019 §5, Table 1): stage >= 1 the master weights and
optimizer state, >= 2 the gradients, 3 the weights, each ceil(n / d) on the most loaded rank; expert states over
the d / ep ranks that hold the same experts. Every byte count of the single-GPU estimator that is proportional to
the parameters (weights, master, gradients, optimizer state, step temporaries) is taken for the rank's share n of
the Ψ parameters as ceil(bytes · n / Ψ): exact for every per-parameter recipe, and identical to the single-GPU
figure when n = Ψ.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from ..catalog.optimizers import Optimizer
from ..catalog.precisions import ZERO_2019, Precision
from ..citations import formula, source
from ..components import finetune as F
from ..components.finetune_method import adapter_shapes
from ..components.optimizer import optimizer_state_bytes, optimizer_step_temporary_bytes
from ..components.weights import gradients_bytes, master_weights_bytes, param_summary, transformer_tensors, weights_bytes
from ..models.arch import Architecture
from . import deepspeed as DS
from .deepspeed import DEEPSPEED_ZERO, deepspeed_offload, offload_keeps_gradients
from .layout import Layout

MEGATRON_2019 = source("shoeybi2019", "Shoeybi et al. 2019, Megatron-LM: Training Multi-Billion Parameter Language "
                       "Models Using Model Parallelism", "arXiv:1909.08053")
MEGATRON_MEMORY = source("megatron-theoretical-memory", "Megatron-LM megatron/training/theoretical_memory_usage.py "
                         "(18 B/param: bf16 weights, fp32 main grads, fp32 main params and Adam state)",
                         "https://github.com/NVIDIA/Megatron-LM/blob/main/megatron/training/theoretical_memory_usage.py")
DEEPSPEED_MEMORY = source("deepspeed-memory", "DeepSpeed documentation, Memory Requirements "
                          "(estimate_zero3_model_states_mem_needs_all_live: largest_layer_memory = "
                          "4 * largest_layer_params)", "https://deepspeed.readthedocs.io/en/latest/memory.html")
ZERO_OFFLOAD = source("ren2021", "Ren et al. 2021, ZeRO-Offload: Democratizing Billion-Scale Model Training",
                      "arXiv:2101.06840")

# Tensor names (components/weights.transformer_tensors) by how tensor parallelism treats them
_TP_SHARDED = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight", "q_proj.bias", "k_proj.bias",
               "v_proj.bias", "gate_proj.weight", "up_proj.weight", "down_proj.weight", "gate_proj.bias",
               "up_proj.bias", "c_attn.weight", "c_attn.bias", "embed_tokens", "lm_head.weight",
               "cls.decoder.weight", "cls.decoder.bias")
_EMBEDDING = ("embed_tokens", "embed_positions", "token_type_embeddings", "embeddings.")
_HEAD = ("final_norm", "lm_head", "cls.", "pooler.", "classifier.", "score.")
MAIN_GRAD_BYTES = 4  # fp32 main gradients (Megatron's main_grad, DeepSpeed's fp32 gradient partition)


@dataclass(frozen=True)
class StageParams:
    """Parameters one rank of a pipeline stage holds (after the tensor/expert split, before ZeRO)."""

    dense: int  # sharded over all d data-parallel ranks by ZeRO
    expert: int  # sharded over the d / ep ranks that hold the same experts
    largest: int  # the largest unit ZeRO-3 gathers at once on this rank (a transformer block, the embedding, the head)
    tensors: int  # parameter tensors on the rank (fused optimizers keep a step per tensor)
    largest_tensor: int = 0  # the largest single tensor on the rank (DeepSpeed ZeRO-3 gathers module by module)
    layer_params: int = 0  # one decoder layer's parameters on the rank (FSDP2's unit)

    @property
    def held(self) -> int:
        return self.dense + self.expert


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def largest_layer_tensor(arch: Architecture) -> int:
    """Elements of the largest parameter tensor of one decoder layer (an MLP projection); 0 but for transformers."""
    if arch.kind != "transformer":
        return 0
    return max((x.numel for x in transformer_tensors(arch) if not x.name.startswith((*_EMBEDDING, *_HEAD))), default=0)


def _group(name: str) -> str:
    if name.startswith(_EMBEDDING):
        return "embedding"
    if name.startswith(_HEAD):
        return "head"
    return "layer"


@formula("parallel.stage_params",
         "first stage: embedding + ⌈L/p⌉ · layer; last: ⌈L/p⌉ · layer + final norm + head (+ the tied embedding); "
         "per tensor: replicated n, TP-sharded ⌈n/t⌉, experts (E/ep) · ⌈n_expert/t⌉",
         MEGATRON_2019, where="§3 (column- and row-parallel linears, vocab-parallel embedding); Megatron-LM keeps "
         "the tied word embedding on the first and last pipeline stages")
@lru_cache(maxsize=256)
def stage_params(arch: Architecture, tp: int = 1, pp: int = 1, ep: int = 1) -> tuple[StageParams, StageParams]:
    """(first stage, last stage) for one rank; the same object twice without pipeline parallelism.
    params models and layer nets are one replicated block (they cannot be split by t, p or ep)."""
    s = param_summary(arch)
    if arch.kind != "transformer":
        one = StageParams(s.total, 0, min(s.largest, s.total), s.n_tensors, min(s.largest, s.total))
        return one, one
    dense = {"embedding": 0, "layer": 0, "head": 0}  # per layer for "layer"
    expert_per_layer = 0
    count = {"embedding": 0, "layer": 0, "head": 0}
    big = {"embedding": 0, "layer": 0, "head": 0}  # the largest single tensor of each group on a rank
    tied_copy = 0
    for x in transformer_tensors(arch):
        g = _group(x.name)
        per = x.numel  # one tensor of the group (per layer for layer tensors)
        if x.name.startswith("experts."):
            e = arch.num_experts
            expert_per_layer += (e // ep) * _ceil(per // e, tp)
            big[g] = max(big[g], _ceil(per // e, tp))
        elif x.name.endswith(_TP_SHARDED) or x.name in _TP_SHARDED:
            dense[g] += _ceil(per, tp)
            big[g] = max(big[g], _ceil(per, tp))
        else:
            dense[g] += per
            big[g] = max(big[g], per)
        count[g] += 1
        if x.name == "embed_tokens":
            tied_copy = _ceil(per, tp)
    tied = arch.tied_embeddings and arch.head in ("causal_lm", "masked_lm")
    n = _ceil(arch.layers, pp)
    layer = dense["layer"] + expert_per_layer
    if pp == 1:
        d = dense["embedding"] + arch.layers * dense["layer"] + dense["head"]
        one = StageParams(d, arch.layers * expert_per_layer, max(layer, dense["embedding"], dense["head"]),
                          count["embedding"] + arch.layers * count["layer"] + count["head"], max(big.values()), layer)
        return one, one
    head = dense["head"] + (tied_copy if tied else 0)
    first = StageParams(dense["embedding"] + n * dense["layer"], n * expert_per_layer,
                        max(layer, dense["embedding"]), count["embedding"] + n * count["layer"],
                        max(big["embedding"], big["layer"]))
    last = StageParams(n * dense["layer"] + head, n * expert_per_layer, max(layer, head),
                       n * count["layer"] + count["head"] + (1 if tied else 0),
                       max(big["layer"], big["head"], tied_copy if tied else 0))
    return first, last


@dataclass(frozen=True)
class RankStates:
    """Bytes of one rank's model states (GPU) and of what it offloads (host)."""

    weights: int  # incl. `gathered`
    gathered: int  # ZeRO-3: the live gathered parameters (current + prefetched unit), in the weight dtype
    master: int
    gradients: int
    optimizer: int
    step_temp: int  # the optimizer step's temporaries
    host: int  # offloaded to host memory by this rank
    step_gradients: int = -1  # the gradients the optimizer step holds (-1: `gradients`; deepspeed_step_gradients)
    norm_temp: int = 0  # DeepSpeed's gradient norm before the step (deepspeed_norm_temp), beside `norm_gradients`
    norm_gradients: int = 0  # the 16-bit gradient partition DeepSpeed holds from the backward's end to the step
    step_released: int = 0  # gathered parameters DeepSpeed's ZeRO-3 no longer holds in the step
    end_released: int = 0  # ... nor from the backward's end (a frozen base: measured with none left before the step)
    offload_buffer: int = 0  # ZeRO-Offload's GPU buffer of the largest gradient, every phase (deepspeed_offload)
    reduce_temp: int = 0  # ZeRO-Offload: what reducing the largest gradient adds in the backward (deepspeed_offload)

    @property
    def gradients_in_step(self) -> int:
        return self.gradients if self.step_gradients < 0 else self.step_gradients


def _share(total_bytes: int, n: int, psi: int) -> int:
    """Bytes proportional to the parameters, for a share n of the Ψ parameters: ⌈bytes · n / Ψ⌉."""
    return _ceil(total_bytes * n, psi) if psi else 0


@formula("parallel.zero_sharded_params",
         "n_z = ⌈n_dense / d⌉ + ⌈n_expert / (d/ep)⌉ for the states ZeRO partitions (stage ≥ 1: master and optimizer "
         "state; ≥ 2: + gradients; 3: + weights), else n = n_dense + n_expert",
         ZERO_2019, where="§5.1-5.3 and Table 1: P_os 4Ψ + KΨ/N_d, P_os+g 2Ψ + (2+K)Ψ/N_d, P_os+g+p (4+K)Ψ/N_d")
def zero_params(sp: StageParams, lay: Layout) -> int:
    return _ceil(sp.dense, lay.dp) + _ceil(sp.expert, max(lay.dp // lay.ep, 1))


@formula("parallel.zero3_gathered_bytes", "2 · largest unit · bytes(weight)  (the unit in use and the prefetched one)",
         DEEPSPEED_MEMORY, where="estimate_zero3_model_states_mem_needs: largest_layer_memory = 4 * largest_layer_params "
         "(two fp16 copies); FSDP all-gathers one wrapped block and prefetches the next",
         note="The unit is a whole transformer block (FSDP's usual wrapping), the embedding or the head: an upper "
              "bound of DeepSpeed's per-module gathering")
def zero3_gathered_bytes(sp: StageParams, prec: Precision) -> int:
    return 2 * sp.largest * prec.weight_bytes



@formula("parallel.deepspeed_buffers",
         "ZeRO-1/2: (1 + overlap_comm) · R · e through the backward;  ZeRO-3: R · e through the backward and the step, "
         "and the gathered parameters max(largest tensor + P, min(Ψ, L)) · e instead of two units",
         DEEPSPEED_ZERO, where="R = reduce_bucket_size, P = stage3_prefetch_bucket_size, L = "
         "stage3_max_live_parameters (1e9, DeepSpeed's default; elements), e = bytes of a 16-bit parameter (the "
         "recipe's weight dtype)",
         note="A ZeRO layout without parallel.deepspeed (or with reduce_bucket_size 0) is FSDP's: no reduce bucket "
              "(FSDP reduce-scatters each unit's gradients as they come). allgather_bucket_size allocates nothing "
              "with all_gather_into_tensor (every NCCL since 2.12). The buckets are counted from the backward's first "
              "moment after the loss's (the head's gradient comes after its log-softmax backward). ZeRO-3, measured "
              "on DeepSpeed 0.19.8's engine (Llama 3.2 1B over 2 ranks): it keeps gathered parameters alive up to L "
              "(2.0 GB of the 2.5 GB model at the forward's end) and makes its bucket in the backward. Its "
              "persistent parameters (stage3_param_persistence_threshold, 1e5 elements: the norms) are not counted.")
def deepspeed_buffers(lay, prec: Precision) -> tuple[int, int]:
    """(bytes through the backward, bytes in the optimizer step) of DeepSpeed's reduce buckets on one rank."""
    if not lay.deepspeed:
        return 0, 0
    if lay.zero in (1, 2):
        return (2 if lay.overlap_comm else 1) * lay.reduce_bucket * prec.weight_bytes, 0
    return lay.reduce_bucket * prec.weight_bytes, lay.reduce_bucket * prec.weight_bytes


@formula("parallel.deepspeed_kept_bucket",
         "ZeRO-1 with gradient accumulation, ZeRO-3 always: the backward's reduce bucket(s) through the later "
         "micro-batches' (ZeRO-3: steps') forward and the loss, beside the gradients they keep", DEEPSPEED_ZERO,
         where="stage_1_and_2.py: ZeRO-1 accumulates into each parameter's .grad and reduces at the boundary; the "
               "bucket made in the first micro-batch's backward is not released until then; stage3.py keeps its "
               "bucket from the backward to the step, so across the micro-batches between",
         note="Measured on DeepSpeed 0.19.8's engine (Llama 3.2 1B over 2 ranks, 2 micro-batches, bucket 5e8, "
              "overlap_comm false): the second micro-batch starts with 1,000,000,000 B of bucket beside the "
              "2,471,628,800 B of gradients, and the estimate was 1.0 GB (5.0 %) low without it; ZeRO-3 (LoRA, real "
              "tensors) the same bucket beside the adapters' partition, 20 % low in the forward without it. ZeRO-2 "
              "releases its bucket: what it keeps is the rank's 16-bit gradient partition (within 19 MB, the tensor "
              "straddling the partition's end). ZeRO-3 keeps it from one step to the next too (stage3.py "
              "ipg_buckets, made once), with its 16-bit gradient partition (grads_live_in_forward): a fresh run's "
              "second step (Llama 3.2 1B over 2, 512 tokens, real tensors) holds both, 2,235,814,400 B, from its "
              "forward on")
def deepspeed_kept_bucket(lay, prec: Precision) -> int:
    """Bytes of DeepSpeed's reduce bucket a micro-batch (ZeRO-3: a step) after the first finds allocated."""
    if not (lay.deepspeed and (lay.zero == 3 or (lay.zero == 1 and lay.accum > 1))):
        return 0
    return deepspeed_buffers(lay, prec)[0]


@formula("parallel.deepspeed_step_gradients",
         "ZeRO-1/2 without offload: n_z · m in the optimizer step (the rank's gradient partition in the master "
         "dtype, in place of the 16-bit gradients);  ZeRO-3: n_z · (m + g), both, and no gathered parameters",
         DEEPSPEED_ZERO,
         where="n_z = the rank's partition (parallel.zero_sharded_params), m = bytes of a master weight (fp32); "
         "stage_1_and_2.py step(): single_grad_partition = flat_grad_partition.to(fp32 partition's dtype), kept as "
         "the fp32 partition's .grad through optimizer.step(), the 16-bit partition released before it",
         note="Measured on DeepSpeed 0.19.8's own engine (tests/data/truth/deepspeed/): ZeRO-1 holds the same "
              "bytes as ZeRO-2 from the backward's end, each rank's 16-bit gradient partition, then its fp32 copy "
              "in the step. The 16-bit buffer also covers the whole of the tensor that straddles the partition's "
              "end (19,372,032 B for Llama 3.2 1B over 2 ranks), not counted.")
def deepspeed_step_gradients(lay, prec: Precision, n_z: int) -> int:
    """Bytes of gradients a DeepSpeed ZeRO rank holds in its optimizer step; -1 where the layout is not DeepSpeed's
    (ZeRO-3: the 16-bit partition stays beside the fp32 copy, measured on DeepSpeed 0.19.8)."""
    if not (_deepspeed_on_gpu(lay) and prec.master_bytes):
        return -1
    return n_z * (prec.master_bytes + (prec.grad_bytes if lay.zero == 3 else 0))


def _deepspeed_on_gpu(lay) -> bool:
    """DeepSpeed stepping on the GPU (no offload; stage_1_and_2.py and stage3.py step)."""
    return lay.deepspeed and lay.offload == "none"


@formula("parallel.deepspeed_norm_temp",
         "ZeRO-1/2 without offload: 8 · min(largest tensor, n_z), beside the 16-bit gradient partition, before the "
         "step", DEEPSPEED_ZERO,
         where="stage_1_and_2.py get_grad_norm_direct: torch.linalg.vector_norm(g.data.to(get_norm_dtype())) per "
         "gradient of the partition, get_norm_dtype() fp64 where the device has it (zero/utils.py); "
         "zero_optimization.compute_grad_norm defaults to true",
         note="Measured on DeepSpeed 0.19.8's engine: Llama 3.2 1B over 4 ranks peaks in the step at the fp64 copy "
              "of the embedding's gradient, 262,668,288 x 8 B, not at the fp32 update. Beside it the rank's 16-bit "
              "gradient partition, under ZeRO-1 as under ZeRO-2")
def deepspeed_norm_temp(lay, prec: Precision, largest_tensor: int, n_z: int) -> int:
    return 8 * min(largest_tensor, n_z) if _deepspeed_on_gpu(lay) and prec.master_bytes and lay.zero in (1, 2) else 0


TORCH_DDP_BUCKETS = source(
    "torch-ddp-api", "PyTorch DistributedDataParallel, gradient_as_bucket_view (default False): \"When set to True, "
    "gradients will be views pointing to different offsets of allreduce communication buckets. This can reduce peak "
    "memory usage, where the saved memory size will be equal to the total gradients size.\"",
    "https://docs.pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html")


@formula("parallel.ddp_buckets", "G: the rank's whole gradients once more, in every phase (DDP's allreduce buckets)",
         TORCH_DDP_BUCKETS, where="Reducer: every parameter that requires a gradient gets a slot in a flat bucket "
         "(bucket_cap_mb each), allocated when the model is wrapped; with gradient_as_bucket_view False (the "
         "default) the .grad tensors are separate from the buckets",
         note="Measured on the CPU (tests/test_parallel_ddp.py: DistributedDataParallel over a gloo group, "
              "MemTracker): the step's peak grows by exactly the gradients' bytes. Counted for layouts over "
              "data_parallel alone at zero_stage 0 (PyTorch's DDP); Megatron's DDP (tensor or pipeline parallel, "
              "fp32 main grads) reduces from its own gradient buffer, ZeRO and FSDP have no DDP buckets. With "
              "parallel.ddp_bucket_view (gradient_as_bucket_view=True) the buckets are the gradients, which then "
              "stay allocated from one step to the next, as zero_grad(set_to_none=False) keeps them")
def ddp_bucket_bytes(arch: Architecture, lay, prec: Precision) -> int:
    """DDP's allreduce buckets on one rank: the whole gradients' bytes where PyTorch's DDP runs the layout and the
    .grad tensors are not views of the buckets (ddp_bucket_view; then the gradients stay allocated between steps,
    parallel/activations.py grads_live_in_forward)."""
    if not lay.ddp or lay.bucket_view:
        return 0
    return gradients_bytes(arch, prec)


ACCELERATE_NO_SYNC = source(
    "accelerate-no-sync", "Hugging Face accelerate 1.15, Accelerator.accumulate: no_sync on every micro-batch but "
    "the last unless GradientAccumulationPlugin(sync_each_batch=True); under FSDP2 no_sync is "
    "set_requires_gradient_sync(False), which keeps each parameter's unsharded gradient until a synced backward",
    "https://huggingface.co/docs/accelerate/concept_guides/gradient_synchronization")


@formula("parallel.kept_gradients", "G_kept = G (the rank's gradients); with gradient_sync last at zero_stage >= 2: "
         "the whole unsharded gradients, as at zero_stage 1",
         ACCELERATE_NO_SYNC, where="the gradients a micro-batch finds kept from the one before, through its forward "
               "and backward (accumulation, pipelines)",
         note="Measured with FSDPMemTracker on the fake process group (tests/data/truth/sharded/*nosync*): Llama "
              "3.2 1B over 2 and 4 ranks, FULL_SHARD and SHARD_GRAD_OP, holds its whole 2,471,628,800 B of bf16 "
              "gradients at the forward and backward peaks; every phase within 16 KiB of this estimate")
def kept_gradients(arch: Architecture, prec: Precision, opt: Optimizer, impl: str, lay: Layout) -> tuple[int, int]:
    """(first stage, last stage) gradient bytes a micro-batch finds kept from the one before (grads_live_in_forward
    says when there are any)."""
    states = rank_states(arch, prec, opt, impl, replace(lay, zero=1) if lay.unsharded_grads_kept else lay)
    return states[0].gradients, states[1].gradients


def deepspeed_gathered_bytes(sp: StageParams, lay, prec: Precision) -> int:
    """ZeRO-3 under DeepSpeed: the gathered parameters it keeps alive (parallel.deepspeed_buffers), at least the module
    in use (at most the rank's largest tensor) and what is prefetched, at most the whole model (a 16.8 M-parameter
    Llama under the default 5e7-element prefetch: its step then to 1,920 B with real tensors)."""
    live = min(sp.held, DS.MAX_LIVE_DEFAULT)
    return min(max(sp.largest_tensor + lay.prefetch_bucket, live), sp.held) * prec.weight_bytes


@formula("parallel.rank_states",
         "W = ⌈W_Ψ·n_w/Ψ⌉ (+ ZeRO-3 gathered), G = n_g · (4 with fp32 main grads, else bytes(grad)), "
         "M, S, T = ⌈X_Ψ·n_o/Ψ⌉; offload optimizer: M + S + 4·n_o to host (no GPU gradients or step temporaries), "
         "offload optimizer+params: + W shard",
         ZERO_2019, ZERO_OFFLOAD, MEGATRON_MEMORY,
         where="ZeRO §5 (which states each stage partitions); ZeRO-Offload §4 (fp32 master, optimizer state and fp32 "
               "gradients on the CPU; fp16 parameters on the GPU); Megatron theoretical_memory_usage.py (18 B/param "
               "with fp32 main grads)",
         note="fp32_grad_accumulation replaces the 16-bit gradients by fp32 main grads (Megatron keeps no 16-bit "
              ".grad beside main_grad): 18 B/param with bf16-master + Adam, as Megatron's and DeepSpeed's estimates")
def rank_states(arch: Architecture, prec: Precision, opt: Optimizer, impl: str, lay: Layout
                ) -> tuple[RankStates, RankStates]:
    """(first stage, last stage) model states of one rank; one object twice without pipeline parallelism."""
    first, last = stage_params(arch, lay.tp, lay.pp, lay.ep)
    out = tuple(_states(arch, prec, opt, impl, lay, sp) for sp in ((first,) if first is last else (first, last)))
    return (out[0], out[0]) if len(out) == 1 else (out[0], out[1])


def _states(arch, prec, opt, impl, lay: Layout, sp: StageParams) -> RankStates:
    if arch.finetune is not None and arch.finetune.adapters:
        return _adapter_states(arch, prec, opt, impl, lay, sp)
    psi = param_summary(arch).total
    n = sp.held
    nz = zero_params(sp, lay)
    n_w = nz if lay.zero >= 3 else n
    n_g = nz if lay.zero >= 2 else n
    n_o = nz if lay.zero >= 1 else n
    gathered = 0
    if lay.zero >= 3:
        gathered = deepspeed_gathered_bytes(sp, lay, prec) if lay.deepspeed else zero3_gathered_bytes(sp, prec)
    w = _share(weights_bytes(arch, prec), n_w, psi)
    if lay.fp32_grads and prec.grad_bytes:
        g = n_g * max(prec.grad_bytes, MAIN_GRAD_BYTES)
    else:
        g = _share(gradients_bytes(arch, prec), n_g, psi)
    m = _share(master_weights_bytes(arch, prec), n_o, psi)
    s = _share(optimizer_state_bytes(arch, prec, opt, impl), n_o, psi)
    t = _share(optimizer_step_temporary_bytes(arch, prec, opt, impl), n_o, psi)
    host, norm_g, step_g = 0, _share(gradients_bytes(arch, prec), n_o, psi), deepspeed_step_gradients(lay, prec, n_o)
    buffer, reduce, ds_host = deepspeed_offload(lay, prec, sp.largest_tensor, n_o, g,
                                                largest_layer_tensor(arch) if offload_keeps_gradients(lay) else 0)
    if lay.offload != "none":
        # the CPU runs the step (in place: DeepSpeedCPUAdam) on the rank's partition: fp32 master weights, optimizer
        # state and the fp32 gradients reduced into it; DeepSpeed's GPU buffers: deepspeed_offload
        host = m + s + (ds_host if ds_host else MAIN_GRAD_BYTES * n_o)
        m = s = t = norm_g = 0
        g, step_g = (g, 0) if offload_keeps_gradients(lay) else (0, -1)
        if lay.offload == "optimizer+params":
            host += w
            w = 0
    return RankStates(weights=w + gathered, gathered=gathered, master=m, gradients=g, optimizer=s, step_temp=t,
                      host=host, step_gradients=step_g,
                      step_released=gathered if _deepspeed_on_gpu(lay) and lay.zero == 3 else 0,
                      norm_temp=deepspeed_norm_temp(lay, prec, sp.largest_tensor, n_o), norm_gradients=norm_g,
                      offload_buffer=buffer, reduce_temp=reduce)


@formula("parallel.deepspeed_adapters",
         "LoRA under DeepSpeed ZeRO-1/2: W = Ψ_base · w + Ψ_A · w on every rank (ZeRO-3: "
         "parallel.deepspeed_adapter_weights);  M, S, T over the rank's partition n_A = ⌈Ψ_A / d⌉ of the adapters;  "
         "gradients as the stage keeps them, of the adapters only",
         DEEPSPEED_ZERO, where="the engine (bf16) casts the whole model, adapters included, to bf16 and flattens "
                               "the trainable parameters alone into its partitioned groups; the frozen base is a "
                               "plain module parameter, whole on every rank",
         note="Measured on DeepSpeed 0.19.8 (tests/data/truth/deepspeed/, Llama 3.2 1B, LoRA r16 on q and v, and on "
              "every linear). The reduce bucket is allocated whole however few the adapters: 5e8 elements x 2 B for "
              "1,703,936 trainable parameters by default")
def _adapter_states(arch: Architecture, prec: Precision, opt: Optimizer, impl: str, lay: Layout,
                    sp: StageParams) -> RankStates:
    ft = arch.finetune
    psi_a = F.adapter_params(arch, ft)
    n = _ceil(psi_a, lay.dp) if lay.zero >= 1 else psi_a  # the rank's partition of the adapters
    g_all = F.gradients_bytes(arch, prec, ft)
    shapes = adapter_shapes(arch, ft)
    largest = max(k for k, _ in shapes)
    weights, gathered = F.weights_bytes(arch, prec, ft), 0
    if lay.zero == 3:
        weights, gathered = deepspeed_adapter_weights(sp, lay, prec, shapes, n)
    master = _share(F.master_weights_bytes(arch, prec, ft), n, psi_a)
    state = _share(F.optimizer_state_bytes(arch, prec, opt, impl, ft), n, psi_a)
    keeps = offload_keeps_gradients(lay)
    buffer, reduce, ds_host = deepspeed_offload(lay, prec, largest, n, g_all if keeps else 0)
    if buffer:  # ZeRO-Offload: the adapters' partition steps on the host
        return RankStates(weights=weights, gathered=0, master=0, gradients=g_all if keeps else 0, optimizer=0,
                          step_temp=0, host=master + state + ds_host, step_gradients=0 if keeps else -1,
                          offload_buffer=buffer, reduce_temp=reduce)
    return RankStates(
        weights=weights + gathered, gathered=gathered, master=master,
        gradients=_share(g_all, n, psi_a) if lay.zero >= 2 else g_all, optimizer=state,
        step_temp=_share(F.optimizer_step_temporary_bytes(arch, prec, opt, impl, ft), n, psi_a), host=0,
        step_gradients=deepspeed_step_gradients(lay, prec, n), norm_temp=deepspeed_norm_temp(lay, prec, largest, n),
        norm_gradients=_share(g_all, n, psi_a), step_released=gathered, end_released=gathered)


@formula("parallel.deepspeed_adapter_weights",
         "LoRA under DeepSpeed ZeRO-3: W = ⌈Ψ_base / d⌉ · w + n_A · w + Σ_{adapter tensors of ≤ T elements} numel · w, "
         "and the gathered parameters as a full fine-tune's (parallel.deepspeed_buffers)",
         DEEPSPEED_ZERO, where="T = stage3_param_persistence_threshold (1e5 elements, DeepSpeed's default): a tensor "
         "that small stays whole on every rank, beside its share of the flat 16-bit partition; n_A = the rank's "
         "partition of the adapters; the frozen base is partitioned like the trainable parameters, each tensor's "
         "partition its own ds_tensor, and gathered module by module")
def deepspeed_adapter_weights(sp: StageParams, lay: Layout, prec: Precision, shapes: list[tuple[int, int]],
                              n_a: int) -> tuple[int, int]:
    """(the rank's held 16-bit parameters, its gathered ones) of a LoRA step under DeepSpeed ZeRO-3."""
    whole = sum(k * count for k, count in shapes if k <= DS.PERSISTENCE_THRESHOLD_DEFAULT)
    held = (_ceil(sp.held, lay.dp) + n_a + whole) * prec.weight_bytes
    return held, deepspeed_gathered_bytes(sp, lay, prec)


NCCL_DOCS = source("nccl-env", "NVIDIA NCCL documentation, Environment Variables (NCCL_BUFFSIZE: 4 MiB per channel "
                   "and peer by default, allocated by NCCL with cudaMalloc, outside PyTorch's allocator)",
                   "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html")
TORCH_DDP = source("torch-ddp", "PyTorch DistributedDataParallel (bucket_cap_mb=25) and FSDP (all-gather of one "
                   "wrapped unit, forward/backward prefetch)",
                   "https://pytorch.org/docs/stable/notes/ddp.html")


@formula("parallel.assumptions.communication_buffers",
         "not counted: NCCL buffers; pipeline send/receive beyond one b·s_l·h tensor", NCCL_DOCS, TORCH_DDP,
         where="NCCL_BUFFSIZE (4 MiB per channel and peer) lives outside the caching allocator, like the CUDA "
               "context (the overheads cover it); PyTorch DDP's buckets are counted (parallel.ddp_buckets), "
               "DeepSpeed's reduce buckets with parallel.deepspeed",
         note="Also assumed: data-parallel ranks hold the same bytes (the most loaded rank is a first or last "
              "pipeline stage), but DeepSpeed ZeRO-2's backward, planned for its last rank "
              "(parallel.deepspeed_first_bucket); ZeRO partitions are even (ceil division); tensor-parallel shards "
              "round up where t does not divide a dimension; expert parallelism routes tokens evenly (activations as "
              "without it); the last stage of an interleaved pipeline keeps one micro-batch like 1F1B")
def communication_buffers_bytes() -> int:
    """What the estimator adds for communication buffers: nothing (stated, not modelled)."""
    return 0


@formula("parallel.infer_rank_model",
         "a rank's model: heads/t, kv_heads/t, ⌈I/t⌉, ⌈V/t⌉ (vocab-parallel), ⌈L/p⌉ layers; hidden whole",
         MEGATRON_2019, where="§3: attention heads and MLP columns split over t; the residual stream is whole on "
                              "every rank",
         note="Inference with tensor/pipeline parallelism: weights, KV cache (kv_heads/t per layer, the stage's "
              "layers) and a prefill's per-layer transients are those of this smaller model; a pipeline stage keeps "
              "the embedding or the head")
@lru_cache(maxsize=256)
def infer_rank_arch(arch: Architecture, tp: int = 1, pp: int = 1) -> Architecture:
    if tp == 1 and pp == 1:
        return arch
    return replace(arch, name=f"{arch.name} (t{tp} p{pp} rank)", heads=arch.heads // tp,
                   kv_heads=arch.kv_heads // tp, intermediate=_ceil(arch.intermediate, tp),
                   vocab=_ceil(arch.vocab, tp), layers=_ceil(arch.layers, pp))
