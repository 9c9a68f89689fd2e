"""What an MoE layer's router saves for the backward (a transformer's saved activations: activations.py)."""
from __future__ import annotations

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
