"""FSDP's parameters, gradients and buffers moment by moment on one rank (issue 22), beside the ZeRO states of
states.rank_states: what fully_shard (FSDP2) holds unsharded from forward to backward, in the blocks' backward and at
the embedding's, measured on one rank of the fake process group (tests/data/truth/sharded/); and where
FullyShardedDataParallel (FSDP1, layout fsdp_version 1) holds other bytes at those moments. plan.py adds them to the
phases of a layout sharded by FSDP over data-parallel ranks alone."""
from __future__ import annotations

from dataclasses import dataclass

from ..catalog.precisions import Precision
from ..citations import formula, source
from ..components.moe import experts_backward, experts_gradient
from ..components.terms import Term
from ..components.weights import gradients_bytes, param_summary, weights_bytes
from ..models.arch import Architecture
from .states import _ceil, _share, stage_params, zero3_gathered_bytes, zero_params

FSDP2 = source("torch-fsdp2", "PyTorch FSDP2 (torch.distributed.fsdp.fully_shard): each wrapped module's parameters "
               "sharded (Shard(0)) at rest, all-gathered for its forward and again for its backward unless "
               "reshard_after_forward=False, the root module's kept unsharded from its forward to its backward "
               "(reshard_after_forward None), the next block prefetched; measured: tests/data/truth/sharded "
               "(FSDPMemTracker, fake process group)",
               "https://docs.pytorch.org/docs/stable/distributed.fsdp.fully_shard.html")
FSDP1 = source("torch-fsdp1", "PyTorch FSDP1 (torch.distributed.fsdp.FullyShardedDataParallel, as accelerate's FSDP "
               "plugin (use_orig_params False) and the Hugging Face Trainer (True) wrap a model by default): each "
               "unit's parameters one flat "
               "parameter, all-gathered into its _full_param_padded and freed after the unit's forward "
               "(_runtime_utils._post_forward_reshard), its gradient reduce-scattered and the unsharded one dropped "
               "(_runtime_utils._reduce_grad), autograd concatenating the unit's view gradients into flat_param.grad; "
               "measured: tests/data/truth/sharded/*-fsdp1w*",
               "https://docs.pytorch.org/docs/stable/fsdp.html")


def fsdp_applies(arch: Architecture, lay) -> bool:
    """FSDP2's own moment-by-moment parameters (fsdp_weight_deltas) for a transformer sharded by FSDP over data
    parallel ranks alone (not DeepSpeed's ZeRO, not with TP/PP, where the ZeRO paper's states stand)."""
    return (arch.kind == "transformer" and lay.zero in (2, 3) and lay.dp >= 2 and not lay.deepspeed
            and lay.tp == 1 and lay.pp == 1 and lay.offload == "none")


@dataclass(frozen=True)
class _Units:
    """One rank's FSDP2 quantities in bytes (weight dtype; gradients in the gradient dtype)."""

    full: int  # the whole model's parameters
    shard: int  # the rank's shard of them
    root: int  # the parameters outside the decoder blocks (embedding, final norm, head)
    block: int  # one decoder block's parameters
    gathered: int  # what rank_states counts gathered under ZeRO-3 (zero3_gathered_bytes)
    root_grad_shard: int  # the rank's shard of the root's gradients
    block_grad_shard: int  # the rank's shard of one block's gradients
    head_grad: int  # the LM head's weight gradient, unsharded (0 without a causal-LM head)


def _units(arch: Architecture, prec: Precision, lay) -> _Units:
    sp, _ = stage_params(arch, lay.tp, lay.pp, lay.ep)
    e, psi = prec.weight_bytes, param_summary(arch).total
    full = weights_bytes(arch, prec)
    root_n = sp.held - arch.layers * sp.layer_params
    grads = gradients_bytes(arch, prec)
    return _Units(full=full, shard=_share(full, zero_params(sp, lay), psi), root=root_n * e,
                  block=sp.layer_params * e, gathered=zero3_gathered_bytes(sp, prec),
                  root_grad_shard=_share(grads, _ceil(root_n, lay.dp), psi),
                  block_grad_shard=_share(grads, _ceil(sp.layer_params, lay.dp), psi),
                  head_grad=arch.vocab * arch.hidden * prec.grad_bytes if arch.head == "causal_lm" else 0)


@formula("parallel.fsdp2_unsharded_parameters",
         "SHARD_GRAD_OP (2): W/d at rest and in the step, W/d + W from forward to backward (+ 1 block's all-gather "
         "output at the loss);  FULL_SHARD (3): W/d + root + 1 block at the loss (forward and backward), + 2 blocks "
         "in the rest of the backward, W/d in the step",
         FSDP2, where="root = the parameters outside the decoder blocks (embedding, final norm, head); a block = one "
         "decoder layer's parameters; both in the weight dtype",
         note="Measured on Llama 3.2 1B over 2, 4 and 8 ranks: the parameters at the backward's peak are exactly "
              "these (3,707,443,200 B with SHARD_GRAD_OP on 2 ranks: the shard and the whole unsharded model; with "
              "FULL_SHARD the shard, the root and one block's all-gather output). The moments past the blocks' "
              "backward: parallel.fsdp2_backward_end.")
def fsdp_weight_deltas(arch: Architecture, prec: Precision, lay) -> tuple[int, int, int, int]:
    """What FSDP2's parameters add to the ZeRO weights of rank_states at (forward end, the backward's first moment,
    its later moments, the optimizer step); zeros where fsdp_applies does not."""
    if not fsdp_applies(arch, lay):
        return 0, 0, 0, 0
    u = _units(arch, prec, lay)
    kept = 0 if lay.fsdp1 else u.block  # FSDP1 keeps no block's all-gather output to the loss
    if lay.zero == 2:  # rank_states holds W (unsharded): add the shard through forward and backward, W goes at rest
        return u.shard + kept, u.shard, u.shard, u.shard - u.full
    ahead = _prefetched(u, lay)  # at the loss, the last block's all-gather, which the root's backward prefetches
    return u.root + kept - u.gathered, u.root + ahead - u.gathered, u.root + u.block + ahead - u.gathered, -u.gathered


def _prefetched(u: _Units, lay) -> int:
    """The next block's all-gather output a FULL_SHARD backward holds beside the unit in use (at the loss, the root's:
    the last block): one block, but none under FSDP1 without backward prefetch (backward_prefetch none, accelerate's
    and the Trainer's default; measured: tests/data/truth/sharded/*-noprefetch-*)."""
    return 0 if lay.fsdp1 and lay.prefetch == "none" else u.block


@formula("parallel.fsdp2_backward_end",
         "at the embedding's backward (both stages): parameters W/d + root, gradients the blocks' shards "
         "(G − the root's shard), + 1 block (the last block's reduce-scatter input, held until the next "
         "reduce-scatter) and, at the last moment, + root (the root's own reduce-scatter input); through the blocks' "
         "backward, + the head's weight gradient (V·h·g) and the top block's gradient shard",
         FSDP2, where="root and block as in parallel.fsdp2_unsharded_parameters; every block resharded after its "
         "backward (reshard_after_backward, FSDP2's default under both strategies)",
         note="Measured on Llama 3.2 1B over 2 and 4 ranks at 128 tokens (tests/data/truth/sharded/*-s128), where "
              "the step peaks there: SHARD_GRAD_OP and FULL_SHARD hold the same bytes at that moment")
def fsdp_backward_end(arch: Architecture, prec: Precision, lay) -> tuple[int, int, int, int]:
    """(weights, gradients, temporaries at the first end moment, at the last) FSDP2 adds at the end of the backward
    to the ZeRO states of rank_states; zeros where fsdp_applies does not."""
    if not fsdp_applies(arch, lay):
        return 0, 0, 0, 0
    u = _units(arch, prec, lay)
    weights = u.shard + u.root - u.full if lay.zero == 2 else u.root - u.gathered
    held = 0 if lay.fsdp1 else u.block  # FSDP1 drops a reduce-scattered input (fsdp1_flat_gradients)
    return weights, -u.root_grad_shard, held, u.root + held


def fsdp_blocks_backward(arch: Architecture, prec: Precision, lay) -> int:
    """What FSDP2 adds to the temporaries of the blocks' backward moments (parallel.fsdp2_backward_end): the head's
    weight gradient (the root's, unsharded until the root's reduce-scatter after the embedding's backward; tied, the
    one waiting for the embedding's) and the top block's gradient shard once the next block's backward runs."""
    if not fsdp_applies(arch, lay):
        return 0
    u = _units(arch, prec, lay)
    return u.head_grad + (0 if lay.fsdp1 else u.block_grad_shard)


@formula("parallel.fsdp2_second_block",
         "SHARD_GRAD_OP at the second block's backward (no checkpointing): the blocks' moment less the top block "
         "(resharded after its backward) and its saved activations, + 2 blocks (the top block's reduce-scatter "
         "input, held until the next one, and the block's own unsharded gradients)",
         FSDP2, where="block as in parallel.fsdp2_unsharded_parameters",
         note="Measured on Llama 3.2 1B over 2 and 4 ranks and Llama 3.1 8B over 8 at 128 tokens, where the step "
              "peaks there with every block but the top one unsharded")
def fsdp_second_block(arch: Architecture, prec: Precision, lay) -> tuple[int, int]:
    """(weights, temporaries) that moment adds to the blocks' moment under SHARD_GRAD_OP; zeros otherwise. FSDP1: the
    top block's own concatenation (parallel.fsdp1_flat_gradients), its weights not yet resharded, standing in for
    the layer's temporaries (plan.py, where fsdp1_applies)."""
    if not fsdp_applies(arch, lay) or lay.zero != 2:
        return 0, 0
    block = _units(arch, prec, lay).block
    if lay.fsdp1:
        return 0, 2 * block + fsdp1_norm_gradient(arch, prec)
    return -block, 2 * block


@formula("parallel.fsdp2_last_block",
         "FULL_SHARD at the last block's backward (no checkpointing): the blocks' moment less one block of "
         "parameters (W/d + root + 1 block), + the other blocks' gradient shards (L - 2 in all), + 3 blocks (the "
         "block's unsharded gradients, the reduce-scatter input before it, the prefetched all-gather output), + the "
         "layer's temporaries once more (dense blocks: twice one GPU's top-layer term); of the activations the "
         "inputs and one layer's saved. An MoE block peaks inside its experts (parallel.fsdp2_last_block_experts)",
         FSDP2, where="root and block as in parallel.fsdp2_unsharded_parameters",
         note="Measured on Llama 3.1 8B (untied head) over 8 ranks at 128 tokens, where the step peaks there")
def fsdp_last_block(arch: Architecture, prec: Precision, lay) -> tuple[int, int, int]:
    """(weights, gradients, temporaries) that moment adds to the blocks' moment under FULL_SHARD; zeros otherwise.
    FSDP1: block 1's concatenation with block 0 prefetched (parallel.fsdp1_flat_gradients), the same parameters and
    shards, standing in for the layer's temporaries (plan.py, where fsdp1_applies)."""
    if not fsdp_applies(arch, lay) or lay.zero != 3:
        return 0, 0, 0
    u = _units(arch, prec, lay)
    if lay.fsdp1:  # without backward prefetch block 0 is not gathered yet: the blocks' moment holds block 1 alone
        ahead = _prefetched(u, lay)
        return -ahead, (arch.layers - 2) * u.block_grad_shard, 2 * u.block + ahead + fsdp1_norm_gradient(arch, prec)
    # the L - 2 shards are the blocks' moment's one and L - 3 more; an MoE block's unsharded gradients at its
    # experts' backward are the experts' alone
    grads = experts_gradient(arch, prec) if arch.num_experts else u.block
    return -u.block, (arch.layers - 3) * u.block_grad_shard, 2 * u.block + grads


@formula("parallel.fsdp2_last_block_experts",
         "an MoE block under FULL_SHARD peaks at its experts' backward (formula moe_experts_backward_bytes): the "
         "dense moment's parameters and shards, its unsharded gradients the experts'; activations: the inputs, the "
         "RoPE tables, block 0's saved and the top block's but what its experts' backward has freed",
         FSDP2, note="Measured on a 4-layer Mixtral (8 experts, top-2) over 2 and 4 ranks, 1,024 and 4,096 tokens")
def fsdp_last_block_experts(arch: Architecture, prec: Precision) -> tuple[Term, Term]:
    """(the top block's saved activations its experts' backward has freed; its temporaries) at that moment, beside
    the per-layer saved activations and the block's gradients counted in plan.py."""
    return experts_backward(arch, prec)


@formula("parallel.fsdp1_block0_unprefetched",
         "FSDP1 FULL_SHARD without backward prefetch, at block 0's concatenation (the last block's backward): the "
         "root and block 0 unsharded, the other L - 1 blocks' gradient shards, block 0's gradients twice (its view "
         "gradients and flat_param.grad), one b·s·h gradient; block 0's saved activations freed",
         FSDP1, where="block as in parallel.fsdp2_unsharded_parameters; with BACKWARD_PRE block 1's moment, holding "
         "block 0 prefetched, is always above it",
         note="Measured on a 4-layer Mixtral over 2 ranks with every layer checkpointed (128 and 1,024 tokens), "
              "whose blocks outweigh its root: the step's peak (tests/data/truth/sharded/*-noprefetch-*)")
def fsdp1_block0(arch: Architecture, prec: Precision, lay) -> tuple[int, int, int]:
    """(weights, gradients, temporaries) that moment adds to the blocks' moment (plan.py), where FSDP1 shards the
    layout at zero_stage 3 without backward prefetch; zeros otherwise."""
    if not fsdp_applies(arch, lay) or lay.zero != 3 or not lay.fsdp1 or lay.prefetch != "none":
        return 0, 0, 0
    u = _units(arch, prec, lay)
    return 0, (arch.layers - 1) * u.block_grad_shard, 2 * u.block + fsdp1_norm_gradient(arch, prec)


@formula("parallel.fsdp_recomputed_blocks",
         "full checkpointing, inside block k's recomputed MLP backward (components/recompute.py), beside the blocks' "
         "moment (its parameters, the head's gradient, FSDP2's one gradient shard): each block down holds one "
         "checkpointed input fewer and one gradient shard more, so the peak is at an end of that run: the top block "
         "(k = L − 1: no shard yet, every checkpointed input), k = L − 2 or k = 1 (L − 1 − k shards, k + 1 "
         "inputs; FSDP2 also holds the reduce-scatter input before it, + 1 block; under SHARD_GRAD_OP the blocks "
         "above are resharded, − 1 block at L − 2), and FSDP1 without prefetch block 0 (L − 1 shards, nothing "
         "gathered ahead); each with down's weight gradient (FSDP1: and the final norm's)",
         FSDP2, FSDP1, where="one GPU's activations and temporaries of the top block's and block 0's moments "
         "(recomputed_block_moments); the prefetched block's all-gather output counted among the temporaries, as "
         "fsdp2_last_block counts it",
         note="Measured (FSDPMemTracker / MemTracker, fake process group): a 3-8-layer Llama of hidden 1,024 and "
              "vocabulary 4,000, tied and untied, over 2, 4 and 8 ranks, FSDP2 and FSDP1 (with and without "
              "prefetch), both strategies, 1-16 x 1,024-4,096 tokens: every backward within the forward's own "
              "bytes, where the plan without these moments was 6.5-9.3 % low; Mistral 7B over 8 FSDP2 ranks, 4 x "
              "2,048: 25 KB (was 7.4 MB low). tests/data/truth/FINDINGS.md")
def fsdp_recomputed_blocks(arch: Architecture, prec: Precision, lay) -> tuple[tuple[int, int, int] | None, ...]:
    """(weights, gradients, temporaries) beside the blocks' moment at the top block's, the second's from the top,
    block 1's and (FSDP1 without prefetch) block 0's moments under full checkpointing (formula above); None where
    fsdp_applies does not or a moment does not apply."""
    if not fsdp_applies(arch, lay) or lay.accum > 1:  # accumulating: the shards kept, measured one micro-batch a step
        return None, None, None, None
    u = _units(arch, prec, lay)
    down, shard = arch.intermediate * arch.hidden * prec.grad_bytes, u.block_grad_shard
    if lay.fsdp1:  # no reduce-scatter input held, no shard in fsdp_blocks_backward; the final norm's gradient waits
        down += fsdp1_norm_gradient(arch, prec)
        if lay.zero == 2:
            return (0, 0, down), (-u.block, shard, down), None, None
        block0 = (0, (arch.layers - 1) * shard, down) if lay.prefetch == "none" else None
        return (0, 0, down), (0, shard, down), (0, (arch.layers - 2) * shard, down), block0
    if lay.zero == 2:
        return (0, -shard, down), (-u.block, 0, u.block + down), None, None
    return (0, -shard, down), (-u.block, 0, 2 * u.block + down), (-u.block, (arch.layers - 3) * shard,
                                                                  2 * u.block + down), None


def fsdp1_applies(arch: Architecture, lay) -> bool:
    """FSDP1's moments (parallel.fsdp1_flat_gradients) in place of FSDP2's: a layout FSDP shards, fsdp_version 1."""
    return fsdp_applies(arch, lay) and lay.fsdp1


def fsdp1_norm_gradient(arch: Architecture, prec: Precision) -> int:
    """The final norm's weight gradient (h·g), the root's, waiting through the blocks' backward for the root's
    reduce-scatter: FSDP1's flat-gradient moments hold it (FSDP2's count it among the rank's shards)."""
    return arch.hidden * prec.grad_bytes


@formula("parallel.fsdp1_flat_gradients",
         "FSDP1 (use_orig_params False) at a unit's backward: autograd concatenates the unit's view gradients into "
         "flat_param.grad, so the unit's gradients are held twice (2 blocks; 2·root at the root's, the backward's "
         "last moment), beside the head's and the final norm's weight gradients and one b·s·h gradient, in place of "
         "the layer's other temporaries; SHARD_GRAD_OP peaks at the top block's (every block unsharded), "
         "FULL_SHARD at block 1's with block 0 prefetched (+ 1 block). The unsharded gradient is dropped once "
         "reduce-scattered (no input held to the next one, as FSDP2 holds), and no block's all-gather output "
         "outlives its forward: the forward peaks at the loss or at the last block's output (its saved "
         "activations and one b·s·h tensor, + its unsharded parameters under FULL_SHARD)",
         FSDP1, where="block and root as in parallel.fsdp2_unsharded_parameters; b·s·h in the residual dtype",
         note="Measured on Llama 3.2 1B over 2 and 4 ranks (s128, s1024) and Llama 3.1 8B over 8 (s128), "
              "SHARD_GRAD_OP and FULL_SHARD: tests/data/truth/sharded/*-fsdp1w*. Llama 3.1 8B over 8 ranks with "
              "FULL_SHARD holds 14,071,660,172 B at the root's concatenation; FSDP2's estimate is 10.2 % lower")
def fsdp1_root_gradients(arch: Architecture, prec: Precision, lay) -> int:
    """The temporaries of FSDP1's last backward moment, the root's concatenation (2·root); 0 for other layouts."""
    return 2 * _units(arch, prec, lay).root if fsdp1_applies(arch, lay) else 0


def fsdp1_last_forward(arch: Architecture, prec: Precision, lay) -> int:
    """The unsharded parameters FSDP1's last block's forward holds at its output beyond the forward's
    (parallel.fsdp1_flat_gradients): the block's under FULL_SHARD; 0 for other layouts."""
    return _units(arch, prec, lay).block if fsdp1_applies(arch, lay) and lay.zero == 3 else 0


@formula("parallel.fsdp2_first_block",
         "FULL_SHARD at the first block's forward: the forward's parameters (W/d + root + 1 block) and their "
         "all-gather outputs (root + 1 block) beside the inputs and the embedding's output",
         FSDP2, where="root and block as in parallel.fsdp2_unsharded_parameters",
         note="Measured on Llama 3.1 8B (untied head: a 2.1 GB root) over 8 ranks at 128 tokens, where the forward "
              "peaks there, 2,537,578,496 B of all-gather outputs")
def fsdp_first_block(arch: Architecture, prec: Precision, lay) -> int:
    """The all-gather outputs that moment adds under FULL_SHARD (0 otherwise)."""
    if not fsdp_applies(arch, lay) or lay.zero != 3:
        return 0
    u = _units(arch, prec, lay)
    return u.block if lay.fsdp1 else u.root + u.block  # FSDP1: the block's, gathered in place
