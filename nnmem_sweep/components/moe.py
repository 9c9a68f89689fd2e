"""An MoE layer's own terms: what its router saves for the backward (a transformer's saved activations:
activations.py), and what its experts' backward frees and makes (the moments inside it: train_plan.py on one GPU,
parallel/fsdp.py under FSDP2's FULL_SHARD)."""
from __future__ import annotations

from ..catalog.precisions import Precision
from ..citations import formula, source
from ..models.arch import Architecture
from .terms import INDEX, STAT, Term

HF_MOE = source("hf-transformers5-moe", "Hugging Face transformers 5 grouped-matmul experts (integrations/moe.py) "
                "behind the Mixtral router (modeling_mixtral.py)",
                "https://github.com/huggingface/transformers/tree/main/src/transformers/integrations")


@formula("moe_router_saved_bytes",
         "4·n + 4 + 2·4·k + 4·8·k per token, + 4·n per layer (n experts, k per token)", HF_MOE,
         where="the fp32 softmax over the n experts, its top-k indices (int64) and their sum (fp32), the normalised "
               "routing weights (fp32) and their permuted copy, the sorted expert ids, each routed token's source "
               "index and the inverse permutation (int64), and the int32 offsets of each expert's tokens",
         note="Measured: Mixtral (4 layers, 8 experts, top-2) at 1,024 to 16,384 tokens (MemTracker): 116 B per "
              "token and 32 B per layer, where the formula before (4·n + 8·k + 4·k + 4 + e·k) counted 64 B and no "
              "offsets")
def router_saved(arch: Architecture) -> Term:
    """What an MoE layer's router and token permutation save for the backward (every rank's whole, under TP)."""
    k, n = arch.experts_per_token, arch.num_experts
    return Term(tok=STAT * n + STAT + 2 * STAT * k + 4 * INDEX * k, const=STAT * n)


@formula("moe_experts_backward_bytes",
         "at the experts' gate_up input gradient: freed k·(4·e·I + e·h) + 4·k + 8·k per token (the experts' outputs, "
         "the permuted routing weights, the inverse permutation); made k·2I·e + k·h·e + 4·k + r·h per token (the "
         "gate_up output's, the routed inputs', the routing weights' and the residual's gradients) beside the "
         "experts' weight gradients n·3·I·h·g", HF_MOE,
         where="n experts, k per token, e the activation dtype, r the residual dtype, g the gradient dtype",
         note="Measured on a 4-layer Mixtral (8 experts, top-2): under FSDP2 FULL_SHARD over 2 ranks at 2 x 512 "
              "tokens (block 1) and on one GPU with full checkpointing at 4 x 512 (block 0), every live tensor at "
              "the peak named by the op that made it (derive/trace.py)")
def experts_backward(arch: Architecture, prec: Precision) -> tuple[Term, Term]:
    """(what a block's saved activations have lost, the temporaries beside them) inside its experts' backward; the
    experts' weight gradients are experts_gradient."""
    h, i, k = arch.hidden, arch.intermediate, arch.experts_per_token
    e, r = prec.act_bytes, prec.residual_bytes
    return (Term(tok=k * (4 * e * i + e * h + STAT + INDEX)),
            Term(tok=k * (2 * i * e + h * e + STAT) + r * h))


def experts_gradient(arch: Architecture, prec: Precision) -> int:
    """An MoE layer's experts' weight gradients, unsharded: n experts' gate_up (2I x h) and down (h x I)."""
    return arch.num_experts * 3 * arch.intermediate * arch.hidden * prec.grad_bytes
