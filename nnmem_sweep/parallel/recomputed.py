"""A block recomputed by full checkpointing (components/recompute.py) on a parallel layout's rank: the one-GPU moments
on the ranks that hold every gradient (DDP, ZeRO-1), FSDP's own at the ends of its run of blocks
(fsdp.fsdp_recomputed_blocks). parallel/plan.py places them among the blocks' backward moments."""
from __future__ import annotations

from .. import columns as C
from ..citations import formula
from ..components import recompute
from ..components.plan import consts, lift, terms_array
from ..components.terms import Term
from ..components.train_plan import recomputed_blocks
from . import fsdp as par_fsdp
from .deepspeed import DEEPSPEED_ZERO
from .states import stage_params, zero_params
from .tables import layout_tables
from .zero_bucket import first_bucket


def recomputed_whole(arch, precs, a_names, c_names, layouts, sizes, device, states, g) -> list:
    """A dense gated model's top block and block 0 recomputed under full checkpointing (components/recompute.py), on
    the layouts whose rank holds every gradient and one GPU's activations (as plan.py's _first_block_experts); none
    where no layout is one of those or no combination checkpoints fully."""
    def whole(lay) -> bool:
        return not lay.splits_model and lay.zero <= 1 and lay.accum == 1 and lay.offload == "none" and \
            not lay.fp32_grads

    if (arch.finetune is not None and arch.finetune.adapters) or not any(whole(lay) for lay in layouts):
        return []
    moments = recomputed_blocks(arch, precs, a_names, c_names, device, sizes, states, g)
    flag = lift(consts([int(whole(lay)) for lay in layouts], (len(layouts),)), (5,), sizes)[..., :1]
    return [("backward", {k: v * flag for k, v in m.items()}) for m in moments]


def recomputed_sharded(arch, precs, a_names, c_names, layouts, sizes, device, states, g_fwd) -> list:
    """FSDP's moments (_sharded with fsdp.fsdp_recomputed_blocks) and DeepSpeed ZeRO-2's (deepspeed_recomputed)."""
    return (_sharded(arch, precs, a_names, c_names, layouts, sizes, device, states, g_fwd,
                     par_fsdp.fsdp_recomputed_blocks, tied_apart=True)
            + _sharded(arch, precs, a_names, c_names, layouts, sizes, device, states, g_fwd, deepspeed_recomputed,
                       tied_apart=False))


@formula("parallel.deepspeed_recomputed_blocks",
         "DeepSpeed ZeRO-2/3 with full checkpointing: the top block's recomputed MLP backward (one GPU's activations "
         "and temporaries there: every checkpointed input, the block's saved once more) beside the rank's states and "
         "the reduce bucket, every gradient made so far copied into the bucket as it is made; where it is reduced "
         "during the backward, the last rank's gradient partition n_z·g from the first reduction on: beside the "
         "second block from the top (one checkpointed input fewer), or already beside the top one where an untied "
         "head above the bucket is reduced alone first; a down projection above the bucket alive through its MLP's "
         "backward (reduced alone at the next gradient); ZeRO-3, its gradient partition kept from step to step, "
         "the top block's moment beside it and the parameters gathered as at the forward's end", DEEPSPEED_ZERO,
         where="components/recompute.py recomputed_block_moments; the bucket as deepspeed_buffers counts it; the first "
               "reduction as parallel.deepspeed_first_bucket finds it",
         note="Measured on DeepSpeed 0.19.8's engine (fake tensors, the last rank): a 4-6-layer Llama of hidden 1,024 "
              "and vocabulary 4,000 over 2 and 4 ranks, 4 x 2,048 tokens, buckets of 3e6, 1e7, 2e7 and 5e8 "
              "elements, tied and untied, within the forward's own bytes where the plan was 3.2 % low (bucket above "
              "the model) and 45-72 MB (3.8-5.8 %) low (reduced during the backward); where the first reduction "
              "comes k blocks below the top the moment is k blocks lower and the estimate an upper bound by k "
              "checkpointed inputs (+16.9 MB, one, at a 3e7 bucket); where DeepSpeed's last partition exceeds "
              "⌈P/d⌉ (4 ranks; a tied head) 1.4-3.1 MB low, as deepspeed_first_bucket is. ZeRO-3 (real tensors, "
              "4-6 layers, 2 and 4 ranks, buckets of 1e7 and 5e8): 51.5 MB (2.3-4.2 %) low without the moment, "
              "7.4-15.6 MB (0.6-1.6 %) high with it, DeepSpeed having released some gathered parameters by then "
              "(tests/data/truth/FINDINGS.md)")
def deepspeed_recomputed(arch, prec, lay) -> tuple[tuple[int, int, int] | None, ...]:  # noqa: ANN001
    """(weights, gradients, temporaries) beside the rank's states at the top block's moment and, where the last
    rank's gradient partition is made during the blocks' backward, at the first block recomputed after it (formulas
    above), on a DeepSpeed ZeRO-2 or ZeRO-3 (the top block's alone) rank over data-parallel ranks alone, one
    micro-batch a step, nothing offloaded; None elsewhere (and at the other moments fsdp_recomputed_blocks has)."""
    if not (lay.deepspeed and lay.zero in (2, 3) and not lay.splits_model and lay.accum == 1 and lay.offload == "none"):
        return None, None, None, None
    if lay.zero == 3:  # its partitions kept from step to step: the top block's moment, every input still held
        return (0, 0, 0), None, None, None
    made, k, alive, tied_end = first_bucket(arch, prec, lay)
    if not made:  # no reduction before the backward's end (a bucket above the model): no partition in the blocks
        return (0, 0, 0), None, None, None
    partition = zero_params(stage_params(arch)[0], lay) * prec.grad_bytes
    head_alone = alive > tied_end  # an untied head above the bucket, reduced alone: the partition made before
    # a down projection above the bucket is reduced alone at the next gradient: alive through the MLP's backward
    down = arch.intermediate * arch.hidden * prec.grad_bytes if arch.intermediate * arch.hidden > lay.reduce_bucket \
        else 0
    return (0, partition if head_alone else 0, down), (0, partition, tied_end + down), None, None


def _sharded(arch, precs, a_names, c_names, layouts, sizes, device, states, g_fwd, fn, tied_apart: bool) -> list:
    """Recomputed blocks' MLP backward on a sharded rank with full checkpointing, `fn(arch, precision, layout)` giving
    each moment's (weights, gradients, temporaries) beside the blocks' moment, or None where the layout lacks it:
    the top block's, the second's from the top, block 1's and block 0's, with one GPU's activations and temporaries
    of the top block's and of block 0's moments (components/recompute.py) and the lower blocks' checkpointed inputs
    (k + 1 at block k). `tied_apart`: a tied head's gradient is counted by the layout's own moments (FSDP's
    fsdp_blocks_backward), not as one GPU's temporary. None where no layout or combination has them."""
    if not any(recompute.applies(arch, c) for c in c_names) or arch.layers < 3:
        return []
    shape = (len(precs), len(a_names), len(c_names))
    per = [(p, recompute.moments(arch, p, a, device) if recompute.applies(arch, c) else None)
           for p in precs for a in a_names for c in c_names]
    ckpt = lift(consts([int(m is not None) for _, m in per], shape), (0, 3, 4), sizes)[..., :1]
    out = []
    by_layout = {(p.name, lay): fn(arch, p, lay) for p in precs for lay in layouts}  # each layout's four moments
    # (the moment, one GPU's moment it takes its activations from: the top's 0, block 0's 1, more inputs held)
    for k, (j, held) in enumerate(((0, 0), (1, arch.layers - 2), (1, 1), (1, 0))):
        if all(m[k] is None for m in by_layout.values()):
            continue
        # every count zero (DeepSpeed's: one GPU's moment beside the rank's states as they are): no table, zeros
        weights, grads, temp = layout_tables(lambda p, lay: by_layout[p.name, lay][k] or (0, 0, 0), precs, layouts,
                                             sizes, (0, 5)) or (0, 0, 0)
        acts = lift(terms_array([m[j][0] + Term(tok=held * p.residual_bytes * arch.hidden) if m else Term()
                                 for p, m in per], shape), (0, 3, 4), sizes)
        # a tied head's gradient, one GPU's temporary there, is fsdp_blocks_backward's here
        tied = [Term(const=arch.vocab * arch.hidden * p.grad_bytes) if j == 0 and arch.tied_embeddings
                and arch.head == "causal_lm" and tied_apart else Term()
                for p, _ in per]
        temps = lift(terms_array([m[j][1] - t if m else Term() for (_, m), t in zip(per, tied)], shape), (0, 3, 4),
                     sizes)
        (on,) = layout_tables(lambda p, lay: (int(by_layout[p.name, lay][k] is not None),), precs, layouts, sizes,
                              (0, 5))
        flag = ckpt * on[..., :1]
        out.append(("backward", dict(states, **{C.WEIGHTS: states[C.WEIGHTS] + weights * flag,
                                                C.GRADIENTS: g_fwd + grads * flag, C.ACTIVATIONS: acts * flag,
                                                C.TEMPORARY: (temps + temp) * flag})))
    return out
