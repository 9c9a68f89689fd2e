"""A dense gated MLP's backward inside a checkpointed block (full checkpointing): the block recomputed with everything
it saves, beside the gradients made so far. Where the logits are small beside a block (a vocabulary a few times the
hidden size: Llama 2 70B's 32,000 for 8,192, Mistral Large's 32,768 for 12,288), one of these moments, not the loss,
is the backward's peak: the top block's (every block's checkpointed input still held) or block 0's (every other
block's gradients made). The one-GPU plan (train_plan.py) and the data-parallel layouts whose rank holds every
gradient (parallel/plan.py) take both as moments of their own.

Measured with MemTracker (tests/measure/test_recompute.py): a 4-layer Llama of hidden 1,024, intermediate 3,584, one
KV head and a 4,000-token vocabulary at 4 x 2,048 tokens peaked in block 0's SiLU-times-up backward, 1,025,200,804 B,
where the plan without these moments said 912,677,020 (11 % low).
"""
from __future__ import annotations

from ..catalog.precisions import Precision
from ..citations import formula
from ..models.arch import Architecture
from ..models.count import params_breakdown
from . import activations as act
from .activations import HF_MODELING
from .terms import Term
from .weights import autocast_copies_bytes, param_summary

ROOT_TENSORS = ("embed_tokens", "final_norm.weight", "lm_head.weight")  # weights.py's tensors outside the blocks


def applies(arch: Architecture, checkpointing: str) -> bool:
    """Dense gated MLPs (LlamaMLP and its kin, RMSNorm) under full checkpointing: the moments here."""
    return (arch.kind == "transformer" and arch.mlp == "gated" and not arch.num_experts and checkpointing == "full"
            and arch.norm == "rmsnorm")


@formula("gated_mlp_backward_bytes",
         "at down(act(gate(x)) · up(x))'s multiplication backward: − e·I (the product, down's saved input, freed "
         "with down's weight gradient), + 3·e·I + r·h per token (the product's gradient and the two it makes; the "
         "residual's gradient), I·h·g made (down's weight gradient); a fp32 residual stream: − 2·r·h saved, "
         "+ r·h temporaries (the first RMSNorm keeps the checkpointed input itself as its fp32 input)", HF_MODELING,
         where="LlamaMLP; e = activation bytes, r = residual bytes, g = gradient bytes",
         note="Measured (MemTracker): block 0 of a 4-layer Llama (h 1,024, I 3,584), b 4 x s 2,048, full "
              "checkpointing: temporaries 192,937,984 B = 8,192 x (3 x 7,168 + 2,048)")
def mlp_backward(arch: Architecture, p: Precision) -> tuple[Term, Term]:
    """(what the recomputed block's saved activations have lost, the temporaries) at that moment. Where the residual
    stream is fp32 (fp32, or under autocast) an RMSNorm's fp32 input is no copy: the recomputed block's first norm
    keeps the checkpointed input itself (r·h fewer), and one more fp32 gradient of the residual is live."""
    e, r, h, i = p.act_bytes, p.residual_bytes, arch.hidden, arch.intermediate
    fp32_stream = 2 * r * h if r == 4 else 0  # MemTracker counts one of the two among the temporaries
    return Term(tok=e * i + fp32_stream), Term(tok=3 * e * i + r * h + fp32_stream // 2)


def _block_copies(arch: Architecture, p: Precision) -> int:
    """Autocast's 16-bit copies the recomputed block's matmuls keep, but down's, freed with its weight gradient."""
    if not p.autocast:
        return 0
    return (sum(t.numel for t in param_summary(arch).tensors if t.name not in ROOT_TENSORS and t.matmul)
            - arch.intermediate * arch.hidden) * p.act_bytes


@formula("recomputed_block_moments",
         "top block: saved − head's + the block's saved once more − freed, temporaries as gated_mlp_backward, "
         "gradients: the head's (untied; tied, the autograd engine holds it as a temporary), the final norm's and "
         "down's;  block 0: inputs + RoPE + autocast copies + the embedding's saved + block 0's checkpointed input "
         "and recomputed saved − freed, gradients: every one but the untied embedding's and block 0's other weights'",
         HF_MODELING, where="full checkpointing (torch.utils.checkpoint): a block's backward recomputes its forward, "
         "its saved activations alive until its own backward frees them")
def moments(arch: Architecture, p: Precision, attention: str, device: str = "cuda"
            ) -> tuple[tuple[Term, Term, int], tuple[Term, Term, int]]:
    """((activations, temporaries, gradients made) at the top block's moment; (activations, temporaries, gradients
    not yet made) at block 0's), full checkpointing."""
    h, v, g = arch.hidden, arch.vocab, p.grad_bytes
    freed, temps = mlp_backward(arch, p)
    layer = act.layer_saved(arch, p, attention, device=device)
    tied = arch.tied_embeddings and arch.head == "causal_lm"
    head = 0 if tied or arch.head != "causal_lm" else v * h
    down = arch.intermediate * h
    saved = act.train_activations(arch, p, attention, "full", device).saved
    copies = Term(const=_block_copies(arch, p))
    top = (saved - act.head_saved(arch, p, device) - Term(const=autocast_copies_bytes(arch, p, "full")) + layer
           + copies - freed,
           temps + (Term(const=v * h * g) if tied else Term()), (head + h + down) * g)
    block = params_breakdown(arch)["per_layer"]
    first = (act.inputs_term(arch) + act.rope_saved(arch, p) + copies + act.embedding_saved(arch, p, device)
             + act.sliding_window_mask(arch, attention) + act.checkpointed_layer_saved(arch, p) + layer - freed,
             temps, ((0 if tied else v * h) + block - down) * g)
    return top, first
