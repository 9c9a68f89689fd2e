"""DeepSpeed ZeRO's backward moments on its most loaded rank (issue 22): ZeRO-2's first bucket, ZeRO-1's reduction
after the backward, ZeRO-3's first bucket.

ZeRO-2 cuts one flat buffer of the 16-bit parameters, in the order the model registers them, into the ranks'
partitions: rank 0 holds the embedding's end, the last rank the last layers and an untied head. A rank makes its
gradient partition when the first reduce bucket that holds one of its parameters is reduced
(stage_1_and_2.py copy_grads_in_partition). The gradients come head first, so the last rank makes its partition at
the backward's first bucket, beside the activations of every layer the backward has not reached; rank 0 only near
the embedding. A tied head's gradient waits in the autograd engine until the embedding's is added to it, so it
stays beside the partition to the end. The estimate is the last rank's: every rank must fit.

ZeRO-3 keeps its gradient partition and its bucket from one step to the next (stage3.py, made once); at the
backward's first bucket every rank holds, beside them, the bucket's gradients flattened for their reduce-scatter; its
gathered parameters there are counted as the forward's (parallel.deepspeed_buffers), which DeepSpeed has partly
released by then.
"""
from __future__ import annotations

from ..catalog.precisions import Precision
from ..citations import formula
from ..components import activations as act
from ..models.arch import Architecture
from ..models.count import params_breakdown
from .deepspeed import DEEPSPEED_ZERO, offload_keeps_gradients, zero_offload
from .layout import Layout
from .states import largest_layer_tensor, stage_params, zero_params


@formula("parallel.deepspeed_first_bucket",
         "the last rank, at the first bucket reduced: its gradient partition n_z·g and the reduce bucket beside the "
         "activations of the layers not yet reached, L − k of them, k = ⌊(B − head − final norm) / layer⌋ "
         "(head = 0 where tied); beside them an untied head's gradient V·h·g where the head alone exceeds B (then "
         "k = 0), a tied head's V·h·g always; ZeRO-3: every rank, its partition kept from the step before, the k "
         "layers' gradients flattened, k·layer·g, beside it", DEEPSPEED_ZERO,
         where="stage_1_and_2.py reduce_independent_p_g_buckets_and_remove_grads: a bucket is reduced when the next "
               "gradient would overflow its B = reduce_bucket_size elements, a tensor larger than B alone; "
               "reduce_ipg_grads -> copy_grads_in_partition makes grads_in_partition (torch.empty of the rank's "
               "partition) for the first parameter of the rank's own",
         note="Measured on DeepSpeed 0.19.8's engine under FakeTensorMode, ranks 0 and 7 of Llama 3.1 8B over 8 "
              "(untied head of 525 M elements > B = 5e8, b 2, s 1024): the last rank peaks in the backward at the "
              "head's gradient beside its 2.04 GB partition, the bucket and every activation, 2.1 % above rank 0's "
              "peak (the loss's moment); Llama 3.2 1B over 2 (tied): the last rank's partition is made half way "
              "through the layers and its backward ends at 3 V·h·g beside it, 8 % above rank 0's. A layer part-way "
              "through its backward at that moment is counted whole (an upper bound of less than one layer). ZeRO-3, "
              "with real tensors (Llama 3.2 1B over 2 ranks, 128 and 512 tokens): its backward peaks there, 1.4 % and "
              "5.3 % above the estimate without this moment; with it the estimate is 3.3 % and 3.2 % high, the "
              "gathered parameters counted as at the forward's end (2.0 GB) where DeepSpeed has released some")
def first_bucket(arch: Architecture, prec: Precision, lay: Layout) -> tuple[int, int, int, int]:
    """(1 where the last rank's partition is made before the backward's end, else 0; k, the layers whose gradients
    all precede it; bytes of a head gradient alive beside it; bytes a tied head's gradient adds to the backward's
    end moments beside the partition, ZeRO-2's). Zero for every layout but DeepSpeed ZeRO-2 and 3 on the GPU of a full
    fine-tune; ZeRO-3's head gradient bytes include the bucket's flattened gradients."""
    # ZeRO-Offload reduces during the backward at ZeRO-2, and at ZeRO-1 with overlap_comm
    offload = zero_offload(lay) and not offload_keeps_gradients(lay)
    if not (lay.deepspeed and (lay.zero in (2, 3) and lay.offload == "none" or offload) and
            arch.kind == "transformer") or (arch.finetune is not None and arch.finetune.adapters):
        return 0, 0, 0, 0
    parts = params_breakdown(arch)
    tied_grad = act.tied_head_gradient(arch, prec).const  # 0 where the head is not tied
    bucket, head = lay.reduce_bucket, 0 if tied_grad else parts["head"]
    if bucket <= 0:  # no reduce bucket (contiguous_gradients false): each gradient kept as it is reduced, the
        return 0, 0, 0, tied_grad if lay.zero == 2 else 0  # tied head's still outside them to the end
    if head > bucket:  # reduced alone at the next gradient, while it is copied into the partition
        k, alive, largest = 0, head * prec.grad_bytes, head
    else:
        k = _layers_before_reduction(parts, head, bucket)
        if k >= arch.layers:  # every gradient but a tied head's in one bucket: reduced at the backward's end
            return 0, 0, 0, 0
        alive, largest = tied_grad, max(head, largest_layer_tensor(arch))
    if offload:  # no partition on the GPU: the fp64 copy of the bucket's largest gradient for its norm
        n_z = zero_params(stage_params(arch)[0], lay)
        return 0, int(k), alive + 8 * min(largest, n_z), tied_grad
    if lay.zero == 3:  # the bucket's gradients flattened (torch.cat) beside it as it is reduce-scattered; the
        # partition is not made here: ZeRO-3 keeps it from step to step (activations.grads_live_in_forward)
        return 0, int(k), alive + k * parts["per_layer"] * prec.grad_bytes, 0
    return 1, int(k), alive, tied_grad


def _layers_before_reduction(parts: dict[str, int], head: int, bucket: int) -> int:
    """k = ⌊(B − head − final norm) / layer⌋: the layers whose gradients, after the head's and the final norm's,
    fill a bucket of B elements before its first reduction (k ≥ L: none during the backward)."""
    return (bucket - head - parts["final_norm"]) // max(parts["per_layer"], 1)


@formula("parallel.deepspeed_whole_bucket",
         "ZeRO-2 whose reduce bucket holds every gradient (B above the model), at the backward's end: the bucket's "
         "gradients flattened for their reduction, P·g, beside the bucket and the rank's states, before the rank's "
         "partition is made; the activations freed but the inputs", DEEPSPEED_ZERO,
         where="stage_1_and_2.py: nothing overflows the bucket during the backward, so its one reduction runs in the "
               "epilogue (reduce_ipg_grads), which flattens the bucket's gradients (a torch.cat of all of them) "
               "before copy_grads_in_partition makes the partition",
         note="Measured on DeepSpeed 0.19.8's engine under FakeTensorMode (a 4-layer Llama of hidden 1,024 and "
              "vocabulary 4,000 over 2 ranks, 1 x 1,024 tokens, full checkpointing, bucket 5e8): the last rank's "
              "backward peaks there, 46,754,164 B (2.9 %) above the estimate without it")
def whole_bucket(arch: Architecture, lay: Layout) -> int:
    """P, the parameters whose gradients are flattened at the backward's end where ZeRO-2's bucket holds them all
    (formula above); 0 for every other layout (adapters, offload and ZeRO-1/3 included)."""
    if not (lay.deepspeed and lay.zero == 2 and lay.offload == "none" and arch.kind == "transformer") or \
            (arch.finetune is not None and arch.finetune.adapters) or lay.reduce_bucket <= 0:
        return 0
    parts = params_breakdown(arch)
    head = parts["head"]  # 0 where tied
    if head > lay.reduce_bucket or _layers_before_reduction(parts, head, lay.reduce_bucket) < arch.layers:
        return 0
    sp = stage_params(arch)[0]
    return sp.dense + sp.expert


@formula("parallel.deepspeed_zero1_reduction",
         "ZeRO-1 without overlap_comm, after the backward: every gradient G, the reduce bucket and the rank's 16-bit "
         "gradient partition n_z·g at once", DEEPSPEED_ZERO,
         where="stage_1_and_2.py: with neither partition_gradients (stage 1) nor overlap_comm no gradient is reduced "
               "during the backward; the engine reduces them all after it (reduce_gradients), and the first of the "
               "rank's own makes grads_in_partition (copy_grads_in_partition) while every .grad is still held",
         note="Measured on DeepSpeed 0.19.8's engine under FakeTensorMode (Llama 3.2 1B over 2 ranks, s 64, bucket "
              "1e7): rank 0's backward peaks there, 1.5 % above the estimate's backward without it")
def zero1_reduction(lay: Layout) -> int:
    """1 where a ZeRO-1 rank reduces every gradient after the backward (its partition made beside them), else 0."""
    return int(lay.deepspeed and lay.zero == 1 and not lay.overlap_comm and lay.offload == "none")
