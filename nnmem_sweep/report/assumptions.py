"""The report's Assumptions section: the precision and optimizer recipes the scenario uses (with whether a measured
case covers them), the runtime overheads and headroom, the GPUs' capacities, and the assumptions of the blocks it
uses (parallelism, fine-tuning, cluster search)."""
from __future__ import annotations

from typing import Any

from .. import columns as C
from ..accuracy import covered
from ..catalog import optimizers, precisions
from ..catalog.precisions import BNB_CUDA_DEQUANT_ROWS
from ..citations import FORMULAS
from ..components import finetune as F
from ..components.overhead import has_convolutions, modelled
from ..components.runtime import nccl_bytes
from ..replays import DEFAULT_NOTE
from ..parallel import states  # noqa: F401  (registers the stated assumptions _stated reads)
from ..parallel.layout import DEFAULT_GPUS_PER_NODE, DEFAULT_HOST_MEMORY, deepspeed_layouts, fsdp_versions
from ..scenario import Scenario
from ..units import parse_size
from .format import DASH, gib, percent
from .points import axis_values, gpu_order


def _bytes_or_dash(value: Any) -> str:
    return DASH if not value else f"{value} B"


def _precision_entry(p: Any) -> dict[str, str]:
    """A precisions.Precision as the report shows it: bytes per element of each kind of tensor, and its `stores`."""
    g = (lambda k: getattr(p, k, None))
    per = [f"weights {_bytes_or_dash(g('weight_bytes'))}", f"grads {_bytes_or_dash(g('grad_bytes'))}",
           f"master {_bytes_or_dash(g('master_bytes'))}", f"optimizer state {_bytes_or_dash(g('state_bytes'))}",
           f"activations {_bytes_or_dash(g('act_bytes'))}"]
    if g("quant_bits"):
        per.append(f"quantised weights {g('quant_bits')} bits ({g('quant')})")
    return {"id": str(g("name")), "stores": str(g("stores") or ""), "detail": ", ".join(per)}


_LAYOUTS = {"full": "one tensor of Ψ elements each, in the parameter's dtype",
            "factored": "a row and a column vector per matrix (factored second moment)",
            "8bit": "uint8 per element plus an fp32 absmax per 2,048-element block"}


def _optimizer_entry(o: Any) -> dict[str, str]:
    """An optimizers.Optimizer: its state tensors, their layout and the temporaries of one step()."""
    g = (lambda k: getattr(o, k, None))
    state = ", ".join(g("state") or ()) or "no state"
    layout = _LAYOUTS.get(str(g("layout")), str(g("layout") or ""))
    stores = f"{state} ({layout})" if g("state") else state
    temps = [f"foreach: {g('foreach_temps') or 0}·Ψ", f"for-loop: {g('forloop_temps') or 0}× the largest tensor"]
    note = str(g("note") or "")
    return {"id": str(g("name")), "stores": f"{g('implementation') or ''}: {stores}".lstrip(": "),
            "detail": "step() temporaries " + ", ".join(temps) + (f". {note}" if note else "")}


def _catalog(module_name: str, ids: list[str]) -> list[dict[str, str]]:
    """Entries of catalog/precisions.py or catalog/optimizers.py for the ids the scenario uses ([] when one of them
    is not in the catalog, e.g. inference's optimizer "none")."""
    table = precisions.PRECISIONS if module_name == "precisions" else optimizers.OPTIMIZERS
    if not all(i in table for i in ids):
        return []
    entry = _precision_entry if module_name == "precisions" else _optimizer_entry
    return [entry(table[i]) for i in ids]


def _with_coverage(entries: list[dict[str, Any]], measured: set[str] | None) -> list[dict[str, Any]]:
    """Mark each recipe entry with whether a committed measured case exercises it ("" when nothing is known)."""
    return [e | {"measured": "" if measured is None else ("yes" if e["id"] in measured else "not yet")}
            for e in entries]


def _stated(name: str) -> str:
    """An assumption registered as data beside the code it qualifies (a citations.formula named '*.assumptions.*',
    e.g. parallel/states.py's communication buffers): its statement, where it comes from, its note and sources."""
    f = FORMULAS.get(name)
    if f is None:
        return ""
    text = f.expression + (f" ({f.where})." if f.where else ".")
    if f.note:
        text += f" {f.note}" + ("" if f.note.endswith(".") else ".")
    if f.sources:
        text += " Sources: " + "; ".join(f"{src.title}, {src.ref}" for src in f.sources) + "."
    return text


_UNSYNCED_TEXT = (
    "Gradient accumulation under FSDP (zero_stage 2 or 3), per parallel.gradient_sync: each (the default: FSDP2's, "
    "accelerate's sync_each_batch) reduce-scatters every micro-batch's gradients into the rank's gradient shards kept "
    "from the micro-batch before, so each micro-batch after the first holds the shards through its forward and "
    "backward; last (set_requires_gradient_sync(False) before every micro-batch but the last: accelerate's no_sync, "
    "its default, as the Hugging Face Trainer runs it) keeps the whole unsharded gradients until the last "
    "micro-batch reduce-scatters them, data_parallel times the shards. Measured on one rank with FSDPMemTracker "
    "(tests/data/truth/sharded/*accum*: every phase exact, either way); a step planned from its own code is traced "
    "at its last micro-batch with them kept. The earlier micro-batches of 'last' hold no more than the last one.")


_FSDP1_TEXT = (
    "Layouts with parallel.fsdp_version 1 are FSDP1 (FullyShardedDataParallel per decoder block and at the root, "
    "as accelerate's FSDP plugin and the Hugging Face Trainer wrap a model by default, use_orig_params False or "
    "True: under FULL_SHARD the same bytes): no block's all-gather output kept "
    "past its forward; each unit's gradients concatenated into its flat gradient, so a unit's backward holds them "
    "twice (a block, and the root at the backward's last moment), and dropped once reduce-scattered (no input held "
    "to the next one); AdamW's step counters one per flat parameter. Measured on one rank with MemTracker "
    "(tests/data/truth/sharded/*-fsdp1w*: 2, 4 and 8 ranks, both strategies, with and without checkpointing, "
    "use_orig_params False, and True under FULL_SHARD, accumulating with its no_sync() or without; every phase "
    "within 16 KiB). With parallel.backward_prefetch pre (BACKWARD_PRE, PyTorch's default) each unit's backward "
    "all-gathers the next unit first; with none (accelerate's FSDP plugin and the Hugging Face Trainer pass no "
    "prefetch unless fsdp_backward_prefetch is set) FULL_SHARD's backward holds one block's parameters fewer, "
    "SHARD_GRAD_OP's the same (measured: tests/data/truth/sharded/*-noprefetch-*, every phase within 16 KiB).{pre} "
    "On a GPU FSDP1 frees through record_stream, which can hold a block until its "
    "stream's work completes: the allocator reserve does not model that (a replayed FSDP1 rank runs on one "
    "stream).")


_SHARDED_RECOMPUTE_TEXT = (
    "Full checkpointing on a tensor- or pipeline-parallel rank or an FSDP rank that accumulates gradients: the "
    "backward's moments inside a recomputed block's MLP, which one GPU's plan, DDP, DeepSpeed ZeRO-1/2/3 and FSDP "
    "ranks hold (components/recompute.py, parallel.fsdp_recomputed_blocks, parallel.deepspeed_recomputed_blocks), are "
    "not placed for it; on FSDP ranks without them the plan was 0.06 % low for Mistral 7B over 8 at 4 x 2,048 tokens "
    "and 6.5-9.3 % where a block outweighs the logits (a vocabulary a few times the hidden size; "
    "tests/data/truth/FINDINGS.md). DeepSpeed's are placed: ZeRO-2's exact where its first reduction comes in the top "
    "block's backward, an upper bound by one checkpointed input per block it comes lower; ZeRO-3's an upper bound "
    "(0.6-1.6 % high measured: the parameters gathered as at the forward's end, some released by then).")


def _fsdp1_text(axes: dict) -> str:
    """_FSDP1_TEXT, saying where a layout's prefetch makes its estimate an upper bound for accelerate's runs."""
    pre = "pre" in {str(v) for v in axes.get(C.BACKWARD_PREFETCH, (C.PARALLEL_DEFAULTS[C.BACKWARD_PREFETCH],))}
    return _FSDP1_TEXT.format(pre=" A run launched by accelerate or the Trainer without fsdp_backward_prefetch does "
                                  "not prefetch: for it a FULL_SHARD row planned with pre is an upper bound by one "
                                  "block (give backward_prefetch none, or the run's accelerate config as "
                                  "parallel.accelerate)." if pre else "")


def _fsdp_offload_text(sc: Scenario) -> str:
    per_node = sc.node.get(C.GPUS_PER_NODE, DEFAULT_GPUS_PER_NODE)
    host = sc.node.get(C.HOST_MEMORY, parse_size(DEFAULT_HOST_MEMORY))
    return ("Offload optimizer+params is FSDP's CPU offload: FSDP1's CPUOffload(offload_params=True), as Answer.AI's "
            "FSDP-QLoRA runs it, each rank's flat-parameter shards and a pinned CPU gradient of each one's size (made "
            "for frozen units too), or FSDP2's CPUOffloadPolicy, the sharded parameters and the trainable ones' "
            "gradients, live in host memory, and the CPU steps the trainable shards there (their master copy, "
            "optimizer state and step temporaries on the host). The GPU's side is the rank's step traced with those "
            "host tensors told apart, each unit's shards copied to the GPU before its all-gather and freed once "
            "gathered, FSDP2's reduce-scattered gradients freed once copied out; measured against MemTracker on one "
            "device less the host's bytes "
            "(tests/data/truth/sharded/*-offload-*: forward and backward to the byte, less MemTracker's leftover of "
            f"a checkpointed run). Host memory per node is the rank's times {per_node} GPUs per node, against "
            f"{gib(host)} of RAM; a layout over it does not fit. Not modelled: the host-device copies' and the CPU "
            "step's time (the speed of an offloaded row is that of the same step without them, an upper bound), "
            "pinned memory's own rounding.")


def _parallel_assumptions(sc: Scenario) -> list[str]:
    axes = axis_values(sc)
    items = ["Every figure is per GPU, on the most loaded rank (the first or the last pipeline stage, whichever holds "
             "more); batch is the micro-batch of one data-parallel rank. Only memory is modelled: a layout that fits "
             "may still be slow (communication, pipeline bubbles)."]
    if sc.mode == "train" and sc.model.kind == "derived":  # planned from its own code: the rank's step traced
        items.append("Each rank's step is the model's own code sharded by PyTorch's FSDP2 (fully_shard per decoder "
                     "block and at the root; zero_stage 3 = FULL_SHARD, 2 = SHARD_GRAD_OP; 0 = every rank runs the "
                     "whole step), traced on one rank of PyTorch's fake process group with its optimizer over the "
                     "rank's shards: parameters, gradients and optimizer state are the rank's shards, the "
                     "all-gathered blocks and the root's unsharded parameters what FSDP2 allocates, moment by moment. "
                     "Checked against FSDPMemTracker on the same step (tests/data/truth/sharded: LoRA exact, QLoRA "
                     "within 0.2 %). QLoRA's quant state is whole on every rank, as with bitsandbytes under FSDP."
                     + (" Layouts with fsdp_version 1 are FSDP1's step traced the same way (FullyShardedDataParallel "
                        "per decoder block and at the root, use_orig_params False: one flat parameter per unit, the "
                        "optimizer over the rank's flat shards; Qwen3 0.6B over 2 ranks, both strategies, "
                        "accumulating too: every phase to the byte). Adapters under FSDP1 are wrapped as the Trainer "
                        "wraps them (peft's fsdp_auto_wrap_policy: each adapter a unit of its own); the frozen root "
                        "and first block, which no gradient hook reshards, are freed at the end of the backward, as "
                        "FSDP1's catch-all reshard frees them on a GPU (a fake-tensor run keeps them: "
                        "tests/data/truth/FINDINGS.md); Qwen3 0.6B, Llama 3.2 1B and 3.1 8B: forward and backward "
                        "as measured."
                        if 1 in fsdp_versions(axes) else ""))
        if any(int(a) > 1 for a in axes.get(C.GRADIENT_ACCUMULATION, ())):
            items.append(_UNSYNCED_TEXT)
        if any(v != "none" for v in axes.get(C.OFFLOAD, ())):
            items.append(_fsdp_offload_text(sc))
        return items
    if sc.mode == "train":
        zero = ("ZeRO partitions over DP (Rajbhandari et al. 2019 §5): stage 1 the master weights and optimizer "
                "state, stage 2 the gradients too, stage 3 the weights too, ⌈n/DP⌉ on every rank")
        deepspeed_only = deepspeed_layouts(axes, every=True)
        if deepspeed_only:  # every layout DeepSpeed's: not FSDP's model
            zero += "; DeepSpeed's buffers and gathered parameters as the DeepSpeed item below says."
        else:
            zero += (
                "; ZeRO-3 adds two gathered copies of the largest unit (a transformer block, the embedding or the "
                "head: the one in use and the prefetched one); without parallel.deepspeed no reduce bucket is "
                "counted. A transformer sharded over data-parallel ranks alone (no TP, PP or offload) is modelled as "
                "PyTorch's FSDP2 runs it, one fully_shard per decoder block and at the root, as measured on one rank "
                "(tests/data/truth/sharded: every phase within 16 KiB at 1,024 tokens, the peak within 0.4 % at "
                "128): ZeRO-2 as SHARD_GRAD_OP (the shard at rest, and every block unsharded from forward to "
                "backward), ZeRO-3 as FULL_SHARD (the shard, the root unsharded from forward to backward, one "
                "block's all-gather at the loss, two blocks in the rest of the backward); each block resharded after "
                "its backward, the embedding's backward holding the blocks' gradient shards and two reduce-scatter "
                "inputs. " + (_fsdp1_text(axes) if 1 in fsdp_versions(axes) else
                              "FSDP1 (FullyShardedDataParallel, accelerate's default) holds other bytes: "
                              "parallel.fsdp_version 1 models it."))
        items += [
            "Parameters per rank (Megatron-LM): attention and MLP matrices and the vocabulary-parallel embedding and "
            "head are split over TP, norms and row-parallel biases are replicated; a pipeline stage holds ⌈L/PP⌉ "
            "layers, the first stage the embedding, the last the final norm and the head.",
            zero,
            "Activations per rank (Korthikanti et al. 2022): TP splits the attention and MLP inner tensors, SP the "
            "rest of each layer's tensors too, CP the sequence; the first stage of a 1F1B pipeline keeps "
            "min(PP, micro-batches) micro-batches in flight."]
        split = any(int(v) > 1 for a in (C.TENSOR_PARALLEL, C.PIPELINE_PARALLEL) for v in axes.get(a, ()))
        accum = any(int(a) > 1 for a in axes.get(C.GRADIENT_ACCUMULATION, ()))
        if "full" in {str(c) for c in sc.grid.get(C.CHECKPOINTING, ())} and (split or (
                (deepspeed_layouts(axes) or accum) and any(int(z) >= 2 for z in axes.get(C.ZERO_STAGE, ())))):
            items.append(_SHARDED_RECOMPUTE_TEXT)
        if any(int(a) > 1 for a in axes.get(C.GRADIENT_ACCUMULATION, ())) and not deepspeed_only and \
                any(int(z) >= 2 for z in axes.get(C.ZERO_STAGE, ())):  # FSDP's sync (DeepSpeed's: its item)
            items.append(_UNSYNCED_TEXT)
        if sc.model.kind == "params" and any(int(z) == 3 for z in axes[C.ZERO_STAGE]):
            items.append(
                f"ZeRO-3's gathered unit of this parameter-count model: {sc.model.largest_layer_params:,} parameters "
                "(model.largest_layer_params, as given)." if sc.model.largest_layer_params else
                "ZeRO-3's gathered unit of this parameter-count model: the whole model (it has no layers and "
                "model.largest_layer_params is not given), so two gathered copies of every parameter are counted, an "
                "upper bound; give largest_layer_params (DeepSpeed's measure: the parameters of the largest module, "
                "e.g. 12·h² + 13·h for a GPT block) to tighten it.")
        if any(axes[C.REDUCE_BUCKET]) or any(axes[C.PREFETCH_BUCKET]):
            items.append("DeepSpeed ZeRO (parallel.deepspeed; DeepSpeed's runtime/zero source): ZeRO-1/2 keep a "
                         "reduce bucket of reduce_bucket_size elements in the parameters' 16-bit dtype through the "
                         "backward (two with overlap_comm), counted from the backward's first moment after the "
                         "loss's; ZeRO-3 keeps one through the backward and the step, and keeps gathered parameters "
                         "alive up to stage3_max_live_parameters (1e9 elements, DeepSpeed's default; at least the "
                         "module in use plus stage3_prefetch_bucket_size elements; a config's smaller value is "
                         "planned at 1e9, an upper bound) instead of two units. The buckets "
                         "are in the temporaries column. allgather_bucket_size allocates nothing "
                         "(all_gather_into_tensor); ZeRO-3's persistent small parameters (the norms) are not counted. "
                         "The step as DeepSpeed 0.19.8 runs it: ZeRO-1 holds what ZeRO-2 holds from the backward's "
                         "end (each rank's 16-bit gradient partition), the norm copies each gradient to fp64, the "
                         "update holds the partition in fp32 (ZeRO-3: beside the 16-bit one, its gathered parameters "
                         "released). Accumulating, ZeRO-1 keeps the whole 16-bit gradients and its reduce bucket "
                         "until the boundary, ZeRO-2 its gradient partition, ZeRO-3 its bucket. The rank is the "
                         "most loaded: under ZeRO-2 the last, which holds the last layers and an untied head and "
                         "makes its gradient partition at the backward's first bucket, beside every activation not "
                         "yet freed (2.1 % above rank 0 for Llama 3.1 8B over 8 at 1,024 tokens). Measured on "
                         "DeepSpeed's own engine, ranks 0 and the last (tests/data/truth/deepspeed): ZeRO-1/2 peaks "
                         "within 0.13 %, their backward within 0.15 %, LoRA within 0.21 %, "
                         "accumulating over 2 micro-batches within 0.11 %; ZeRO-3, which keeps its reduce bucket and "
                         "16-bit gradient partition from one step to the next, two cases (Llama 3.2 1B over 2 ranks, "
                         "128 and 512 tokens): its step to the byte, its forward 0.12-0.14 % above the estimate, its "
                         "backward 0.11 % above where it is the peak (3.3 % below at 128 tokens, where the estimate "
                         "counts at its first bucket the gathered parameters of the forward's end); LoRA under ZeRO-3 "
                         "within 0.5 %.")
        if any(axes[C.FP32_GRAD_ACCUMULATION]):
            items.append("fp32 grads: Megatron-style fp32 main gradients replace the 16-bit ones (4 bytes per "
                         "parameter, 18 per parameter with bf16-master and Adam).")
        if any(v != "none" for v in axes[C.OFFLOAD]):
            per_node = sc.node.get(C.GPUS_PER_NODE, DEFAULT_GPUS_PER_NODE)
            host = sc.node.get(C.HOST_MEMORY, parse_size(DEFAULT_HOST_MEMORY))
            items.append(f"Offload (ZeRO-Offload): the rank's fp32 master weights, optimizer state and fp32 gradient "
                         f"partition (with optimizer+params the 16-bit weights too) live in host memory and the CPU "
                         f"runs the step in place; host memory per node is the rank's times {per_node} GPUs per node, "
                         f"against {gib(host)} of RAM, and a layout over it does not fit. The CPU step's speed is "
                         f"not modelled. " + _ZERO_OFFLOAD_TEXT)
    else:
        items.append("Inference over TP and PP: each rank runs a smaller model (heads/TP, KV heads/TP, the MLP and "
                     "vocabulary split over TP, ⌈L/PP⌉ layers), so its weights, KV cache and prefill transients are "
                     "those of that model; DP replicas hold the same bytes.")
    stated = _stated("parallel.assumptions.communication_buffers")
    if stated:
        items.append(f"Communication buffers, {stated}")
    return items


_ZERO_OFFLOAD_TEXT = (
    "With DeepSpeed at ZeRO-1/2 (offload optimizer) the GPU also holds what DeepSpeed's engine makes there, measured "
    "on its own engine with the host's storages told apart (tests/data/truth/deepspeed/*-offload-*, 12 cases, every "
    "phase within 0.21 %): a buffer of the largest trainable tensor's 16-bit gradient, the reduce bucket, and, as "
    "each gradient is reduced, its slice in the rank's partition in fp64 for the norm (parallel.deepspeed_offload). "
    "ZeRO-3's offload (optimizer, optimizer+params) is the paper's accounting alone, not measured: a one-device run "
    "cannot see the host-to-GPU copies it makes, and the same accounting was 5.4-40.4 % low at ZeRO-1/2; verify such "
    "rows by measuring.")


def _finetune_assumptions(sc: Scenario) -> list[str]:
    ft = getattr(sc.model, "finetune", None)
    if ft is None or not ft.adapters:
        return []
    name = "QLoRA" if ft.method == "qlora" else "LoRA"
    targets = F.trained(sc.model, ft)[0]
    deepspeed = deepspeed_layouts(axis_values(sc))
    dtype = ("fp32 (peft casts the adapters of a 16-bit model to fp32: autocast_adapter_dtype=True)"
             if ft.adapter_dtype == "fp32" else "the model's dtype (DeepSpeed's bf16 engine casts the whole model)"
             if deepspeed else "the model's dtype (autocast_adapter_dtype=False)")
    items = [
        f"{name} (Hu et al. 2021): the base weights are frozen, so they have no gradients, master copy or optimizer "
        f"state; the optimizer is given the adapters only." + (
            " Under DeepSpeed ZeRO-1/2 every rank holds the frozen base whole and its partition of the adapters' "
            "fp32 copy and optimizer state; the reduce bucket is allocated whole however few the adapters "
            "(measured on DeepSpeed 0.19.8's engine, tests/data/truth/deepspeed)." if deepspeed else "") + (
            " Under ZeRO-3 the frozen base is partitioned and gathered as a full fine-tune's, adapter tensors of at "
            "most 1e5 elements stay whole on every rank (stage3_param_persistence_threshold), and every linear saves "
            "its input, frozen or not (DeepSpeed's ZeRO-3 linear): two cases measured, the forward within 0.5 %, the "
            "backward's peak from 0.55 % low to 4.5 % high (the gathered parameters through the backward, kept as at "
            "the forward's end, where DeepSpeed releases the head after its backward and prefetches layers again)."
            if deepspeed and any(int(z) == 3 for z in axis_values(sc).get(C.ZERO_STAGE, ())) else ""),
        f"Adapters A (rank × in) and B (out × rank), without bias, on {targets} of every layer, in {dtype}.",
        "Activations of the frozen base are still stored where the backward pass to the adapters needs them: a "
        "frozen linear saves no input of its own, a frozen RMSNorm keeps its fp32 input, and nothing before the "
        "first adapter is saved. LoRA figures are checked against peft runs measured with PyTorch's MemTracker."]
    if sc.model.kind == "derived":  # the adapters traced on the model's own code: no hand formula applies
        items[2] = ("The training step is traced with peft's get_peft_model(LoraConfig(...)) on the model as "
                    "transformers builds it (derive/): what the frozen base keeps for backward is what autograd keeps "
                    "in that step, and the optimizer's state and step temporaries are counted over what peft leaves "
                    "trainable. Checked against peft runs measured with PyTorch's MemTracker (Qwen3, Gemma 2, "
                    "modules_to_save, QLoRA on Llama 3.2 1B and Qwen3: tests/data/truth/finetune).")
        if ft.modules_to_save:
            items.append(f"peft's modules_to_save ({', '.join(ft.modules_to_save)}): each module is copied and the "
                         "copy trained whole (its gradients and optimizer state in the model's dtype), the original "
                         "kept frozen beside it.")
    if ft.method == "qlora":
        items.append("QLoRA (Dettmers et al. 2023), as BitsAndBytesConfig(load_in_4bit, nf4, double quantisation) and "
                     "peft's prepare_model_for_kbit_training leave the model: every linear but the LM head stored in "
                     "NF4 by bitsandbytes itself (packed weights, uint8 block scales per 64 values, fp32 scales per "
                     "256 of those, each matrix's code tables), every other parameter in fp32, so the embeddings' "
                     "output and the residual stream are fp32 too. Each 4-bit matmul is traced as bitsandbytes runs "
                     f"a training step on CUDA past {BNB_CUDA_DEQUANT_ROWS:,} rows (b·s): the weight dequantized to the "
                     "compute dtype for F.linear, and again for the input's gradient, nothing of the input kept. "
                     f"Below {BNB_CUDA_DEQUANT_ROWS:,} rows bitsandbytes may pick a fused kernel without the dequantized "
                     "copy: the estimate then counts one matrix too many, briefly. Measured on the CPU under "
                     "MemTracker with bitsandbytes' own storage (its 4-bit CUDA kernels themselves are not run)."
                     + (" Layouts with fsdp_version 1 run FSDP-QLoRA instead: FSDP1 flattens a unit into one float "
                        "dtype, so the 4-bit bytes are stored as elements of the model's dtype "
                        "(bnb_4bit_quant_storage) and every other parameter stays in it (TRL's SFTTrainer skips "
                        "prepare_model_for_kbit_training for a sharded QLoRA). Measured so on Qwen3 0.6B over 2 and 4 "
                        "ranks (tests/data/truth/sharded): forward and backward as traced."
                        if sc.parallel and 1 in fsdp_versions(axis_values(sc)) else ""))
    return items


_REFERENCES = {
    "model": "a frozen copy of the model, its weights held beside the policy's, run under no_grad on the same 2·batch "
             "sequences after the policy's forward (its logits and log-softmax transient beside the policy's saved "
             "activations)",
    "adapters": "the policy itself with its LoRA adapters disabled (peft's disable_adapter), run under no_grad after "
                "its own forward: no second copy of the weights",
    "precomputed": "log-probabilities computed beforehand and given with the batch (TRL's precompute_ref_log_probs): "
                   "no reference forward in the step",
}


def _preference_assumptions(sc: Scenario) -> list[str]:
    """What a `preference:` block's step is (workload/preference.py), where the scenario has one."""
    spec = sc.model.derived.source.preference if sc.model.kind == "derived" else None
    if not spec:
        return []
    items = [f"{spec['loss'].upper()} as TRL's trainers run it: batch counts preference pairs; the chosen and the "
             "rejected sequences (seq_len tokens each, prompt and completion) go through the policy as one batch of "
             "2·batch, and each sequence's log-probability is the sum of its next tokens' log-softmax. Planned from "
             "the model's own code with that step traced (derive/); checked against the same step measured with "
             "PyTorch's MemTracker (DPO with a reference model, DPO on LoRA with the adapters disabled, SimPO: "
             "tests/data/truth/finetune)."]
    if spec["loss"] == "dpo":
        items.append(f"The reference: {_REFERENCES[spec.get('reference', 'model')]}.")
    else:
        items.append(f"{spec['loss'].upper()} is reference-free: the log-probabilities normalised by the length, no "
                     "reference forward.")
    items.append("Not modelled: GRPO and PPO (a generation inside the step, reward and value models), reward-model "
                 "training, and TRL's padding of a batch to its longest sequence (every sequence is seq_len long).")
    return items


_ZERO_GRAD = {
    "set_to_none": "set_to_none: optimizer.zero_grad(set_to_none=True), torch >= 2.0's default, frees the gradients "
                   "after each step, so forward and the start of backward hold none.",
    "zeros": "zeros: zero_grad(set_to_none=False), torch < 2.0's default (DDP's gradient_as_bucket_view buckets "
             "alike), keeps them allocated: one more copy of the trainable parameters' gradients at forward and "
             "backward; the optimizer step's peak is unchanged (measured with PyTorch's MemTracker).",
}


def _zero_grad_assumptions(sc: Scenario) -> list[str]:
    """What zero_grad leaves between steps, where the scenario names the axis (columns.OPTIONAL_AXES)."""
    return [_ZERO_GRAD[str(v)] for v in sc.grid.get(C.ZERO_GRAD, ()) if str(v) in _ZERO_GRAD]


def _cluster_assumptions(sc: Scenario) -> list[str]:
    search = sc.cluster
    if search is None:
        return []
    return [
        "Cluster options keep, for each GPU type and GPU count, one layout that fits, by a stated rule: the least "
        "recomputation, then no pipeline, the smallest TP, the lowest ZeRO stage, the largest micro-batch. The rule "
        "stands in for what the throughput estimate does not model (communication, pipeline bubbles).",
        f"The search keeps TP within a node ({search.gpus_per_node} GPUs), turns sequence parallelism on whenever "
        f"TP > 1 and splits the global batch as micro-batch × DP × accumulation steps (the pipeline's micro-batches "
        f"when PP > 1); the recipe is the grid's first values.",
        "Costs are the price of the GPUs (or per hour) as given in the scenario; the cost per 10^9 tokens trained is "
        "the price per GPU-hour times the GPU-hours the throughput estimate gives (Throughput estimate).",
        ("Recommended: the option with the lowest estimated cost per 10^9 tokens trained (cluster.rank_by: "
         "cost_per_token), ties to the fewest GPUs." if search.rank_by == "cost_per_token" else
         "Recommended: each type's fewest GPUs, the cheapest of those when every GPU has a price (cluster.rank_by: "
         "gpus).")]


def _peaks(g: Any) -> str:
    """'bf16 989.5, fp8 1,979 TFLOP/s dense, 3,350 GB/s' of a catalogued GPU ('' when the catalog has none)."""
    flops = ", ".join(f"{d} {f / 1e12:,.4g}" for d, f in g.peak_dense_flops)
    bw = g.memory_bandwidth_bytes_per_s
    parts = ([f"{flops} TFLOP/s dense"] if flops else []) + ([f"{bw / 1e9:,.0f} GB/s"] if bw else [])
    return ", ".join(parts)


def throughput_assumptions(sc: Scenario, assumed: list[tuple[str, str]]) -> list[str]:
    """What the throughput estimate rests on: its model, each utilisation it assumed (with how it follows from its
    sources) and each GPU's datasheet figures (with where they come from)."""
    items = [
        "An estimate from published figures, not a measurement; it never changes a memory figure. Training: tokens/s "
        "per GPU = MFU × the dense peak FLOP/s of the recipe's compute dtype / model FLOPs per token, 6·N + "
        "12·L·H·Q·T (PaLM App. B), the same MFU at every GPU count (no scaling loss). Serving: a decode step reads "
        "the weights once for the batch and each sequence's KV cache, and lasts at least that long and at least its "
        "FLOPs (Pope et al. 2022); tensor-parallel communication is not modelled, so it errs fast."]
    items += [f"{label}: {note}." for label, note in assumed]
    for g in gpu_order(sc):
        peaks = _peaks(g)
        items.append(f"{g.name}: {peaks} ({g.spec_source or 'source not recorded'})." if peaks else
                     f"{g.name}: no peak FLOP/s or bandwidth in the GPU catalog; its throughput is unknown.")
    return items


def runtime_assumptions(sc: Scenario) -> list[str]:
    """What a real GPU needs beyond the step's tensors, item by item with its source (components/overhead.py)."""
    o = sc.overheads
    items = []
    if o.cuda_context_bytes is not None:
        items.append(f"Memory outside PyTorch's allocator: {gib(o.cuda_context_bytes, 2)} per GPU, as given in the "
                     "scenario (overheads.cuda_context), for the CUDA context and NCCL together.")
    if o.cublas_workspace_bytes is not None:
        items.append(f"Library workspaces inside the allocator: {o.cublas_workspace_bytes:,} bytes per GPU, as given "
                     "(overheads.cublas_workspace).")
    if o.cuda_context_bytes is None or o.cublas_workspace_bytes is None:
        given = ", ".join(f"{k} {v}" for k, v in o.runtime) or "nothing stated: torch >= 2.0 assumed"
        items.append(f"Runtime: {given}. Modelled per GPU from public measurements (catalog/runtime.json):")
        gpus = gpu_order(sc)
        seen: dict[str, list[str]] = {}  # each item once, with the GPUs it holds for
        for g in gpus:
            for line in modelled(o, g, sc.mode, has_convolutions=has_convolutions(sc.model)).lines():
                if (o.cuda_context_bytes is None or "context" not in line) and \
                        (o.cublas_workspace_bytes is None or "workspace" not in line):
                    seen.setdefault(line, []).append(g.name)
        items += [f"{'Every GPU' if len(names) == len(gpus) else ', '.join(names)}: {line}"
                  for line, names in seen.items()]
        if o.cuda_context_bytes is None and (sc.parallel or (sc.mode == "infer" and any(
                int(t) > 1 for t in (sc.serving or {}).get("tensor_parallel", ())))):
            nccl = nccl_bytes({"tensor_parallel": 2})[0]
            items.append(f"NCCL: one communicator per parallel group of more than one GPU, "
                         f"{gib(nccl.bytes, 2)} each on every GPU of the group, outside the allocator ({nccl.source}).")
    if o.allocator_reserve_fraction is not None:
        how = "as given (overheads.allocator_reserve)"
    else:
        how = o.reserve_note or ("not replayed: " + DEFAULT_NOTE)
    upto = "up to " if o.replayed_by_recipe and len({f for _, f in o.replayed_by_recipe}) > 1 else ""
    items.append(f"Allocator reserve (reserved minus allocated): {upto}{percent(o.reserve_fraction)} of the peak "
                 f"allocated; {how}.")
    return items


def assumptions(sc: Scenario, validation_table: Any = None, sharded_table: Any = None) -> dict[str, Any]:
    o = sc.overheads
    cov = None
    if validation_table is not None:  # a recipe a sharded step's case measures is measured too
        cov = {axis: covered(validation_table, axis) | covered(sharded_table, axis)
               for axis in (C.PRECISION, C.OPTIMIZER)}
    return {
        "precisions": _with_coverage(
            _catalog("precisions", [str(v) for v in sc.grid.get(C.PRECISION, ()) if v is not None]),
            cov and cov[C.PRECISION]),
        "optimizers": _with_coverage(
            _catalog("optimizers", [str(v) for v in sc.grid.get(C.OPTIMIZER, ()) if v is not None]),
            cov and cov[C.OPTIMIZER]),
        "coverage_known": cov is not None,
        "attention": ", ".join(str(v) for v in sc.grid.get(C.ATTENTION, ())),
        "checkpointing": ", ".join(str(v) for v in sc.grid.get(C.CHECKPOINTING, ())),
        "optimizer_impl": ", ".join(str(v) for v in sc.grid.get(C.OPTIMIZER_IMPL, ())),
        "runtime": runtime_assumptions(sc),
        "headroom": percent(sc.headroom),
        "gpus": [{"name": g.name, "memory": gib(g.memory_bytes, 2), "bytes": f"{g.memory_bytes:,}",
                  "source": g.source} for g in gpu_order(sc)],
        "model": {"name": sc.model.name, "params": f"{sc.model.params:,}", "origin": sc.model.origin or sc.model.preset},
        # what the parallel model, the fine-tuning model and the cluster search rely on: only for the blocks used
        "groups": [{"title": title, "items": items} for title, items in (
            ("Parallelism and sharding", _parallel_assumptions(sc) if sc.parallel else []),
            ("Gradients between steps (zero_grad)", _zero_grad_assumptions(sc)),
            ("Fine-tuning", _finetune_assumptions(sc)),
            ("Preference tuning", _preference_assumptions(sc)),
            ("How many GPUs", _cluster_assumptions(sc))) if items],
    }
