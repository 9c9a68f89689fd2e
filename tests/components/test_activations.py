"""Per-layer activation terms counted by hand, and Korthikanti et al. 2022's sbh(34 + 5as/h) reproduced."""
import pytest

from nnmem_sweep.catalog.precisions import get_precision
from nnmem_sweep.components import activations as act
from nnmem_sweep.components.terms import Term

from .tiny_models import TINY_GPT2, TINY_LLAMA, replace

FP32, BF16 = get_precision("fp32"), get_precision("bf16")


def test_korthikanti_2022_table2_gpt_layer():
    # GPT layer, 16-bit activations, 1-byte dropout masks, GeLU MLP (ffn = 4h), eager attention:
    # sbh(34 + 5as/h) bytes, i.e. 34h per token + 5a per token per context token. We also count LayerNorm's fp32
    # mean and rstd (2 x 4 B per token per LayerNorm), which the paper leaves out: + 16.
    arch = replace(TINY_GPT2, hidden=64, heads=4, head_dim=16, kv_heads=4, intermediate=256)
    layer = act.layer_saved(arch, BF16, "eager")
    assert layer == Term(tok=34 * 64 + 16, s2=5 * 4)
    # selective recomputation removes exactly the 5as²b term
    assert act.layer_saved(arch, BF16, "eager", drop_scores=True) == Term(tok=34 * 64 + 16)
    # full recomputation keeps the layer input, 2sbh
    assert act.checkpointed_layer_saved(arch, BF16) == Term(tok=2 * 64)


def test_tiny_llama_layer_fp32_flash():
    # RMSNorm: (4 + 4)·8 + 4 = 68, twice: 136
    assert act.norm_saved(TINY_LLAMA, FP32) == Term(tok=68)
    # attention: qkv input 4·8 + Q,K,V 4·(8 + 4 + 4) + SDPA output 4·8 (also the o_proj input) + lse 4·2 = 136
    assert act.attention_saved(TINY_LLAMA, FP32, "flash") == Term(tok=32 + 64 + 32 + 8)
    # SwiGLU: input 4·8 + gate, silu, up, product 4·4·16 = 288
    assert act.mlp_saved(TINY_LLAMA, FP32) == Term(tok=32 + 256)
    assert act.layer_saved(TINY_LLAMA, FP32, "flash") == Term(tok=560)
    # RoPE cos and sin, fp32, per position, shared by the batch and the layers: 2 x 4 x 4
    assert act.rope_saved(TINY_LLAMA, FP32) == Term(pos=32)


def test_tiny_llama_eager_gqa_repeats_kv_and_keeps_fp32_softmax():
    # eager: repeat_kv copies K and V to the query width 8: Q,K,V 4·24 = 96; o_proj input (contiguous transpose
    # of P·V) 4·8; softmax (fp32) a·4 per s
    assert act.attention_saved(TINY_LLAMA, FP32, "eager") == Term(tok=32 + 96 + 32, s2=2 * 4)
    # bf16: fp32 softmax output 4 + its bf16 cast 2 = 6 per head
    assert act.attention_saved(TINY_LLAMA, BF16, "eager").s2 == 2 * 6


def test_gelu_new_saves_three_more_intermediates():
    new = replace(TINY_GPT2, activation="gelu_new")
    diff = act.mlp_saved(new, BF16).tok - act.mlp_saved(TINY_GPT2, BF16).tok
    assert diff == 3 * 2 * 32  # tanh(.), 1 + tanh(.), 0.5·x, each e·I


def test_moe_routes_k_tokens_per_token():
    moe = replace(TINY_LLAMA, num_experts=4, experts_per_token=2)
    # input 4·8 + router (softmax 4·4 + sum 4 + routing weights and their permuted copy 2·4·2 + top-k indices, sorted
    # ids, source indices, inverse permutation 4·8·2 = 100) + 2 x (expert MLP 256 + gathered input and output 2·4·8);
    # the int32 offsets of the 4 experts' tokens, 16 B per layer
    assert act.mlp_saved(moe, FP32) == Term(tok=32 + 100 + 2 * (256 + 64), const=16)


def test_train_terms_tiny_llama_fp32():
    t = act.train_activations(TINY_LLAMA, FP32, "flash", "none")
    # inputs 16 + 2 layers x 560 + head (final norm 68 + lm_head input 32) = 1236 per token; RoPE 32 per position
    assert t.saved == Term(tok=1236, pos=32)
    assert t.inputs == Term(tok=16)
    # fp32 logits are their own upcast: logits 4·32 + log_softmax 4·32 + labels pad/shift 16
    assert t.forward_temp == Term(tok=128 + 128 + 16)
    # the loss backward (3 x 4·32 per token), or the last MLP's down projection backward: gradients of the
    # residual and of its output 2·4·8, of its input 4·16, and its 16 x 8 fp32 weight gradient
    assert t.backward_start_temp == (Term(tok=3 * 4 * 32), Term(tok=64 + 64, const=512))
    assert t.backward_end_temp == (Term(tok=32),)  # untied: the embedding's dense gradient is .grad itself


def test_tied_embedding_gradient_is_summed_at_the_end_of_backward():
    # GPT-2 ties wte and lm_head: the embedding backward's dense (32, 8) fp32 gradient (1024 B) lives beside the
    # LM head's, then AccumulateGrad sums them into a third: measured as 3 x wte of temporaries on GPT-2 small
    t = act.train_activations(TINY_GPT2, FP32, "flash", "none")
    assert t.backward_end_temp == (Term(tok=32, const=1024), Term(const=2048))


def test_full_checkpointing_recomputes_one_layer_in_backward():
    t = act.train_activations(TINY_LLAMA, FP32, "flash", "full")
    assert t.saved == Term(tok=16 + 2 * 32 + 100, pos=32)  # inputs + layer inputs + head; RoPE
    assert Term(tok=560) in t.backward_start_temp


def test_bf16_mixed_adds_autocast_copies_and_upcasts_logits():
    p = get_precision("bf16-mixed")
    t = act.train_activations(TINY_LLAMA, p, "flash", "none")
    assert t.saved.const == 2816  # 16-bit copies of the 1408 matmul weights
    # bf16 logits 2·32 + fp32 copy 4·32 + fp32 log_softmax 4·32 + labels 16
    assert t.forward_temp == Term(tok=64 + 128 + 128 + 16)


def test_prefill_temp_tiny_llama_bf16():
    attn, mlp, logits = act.prefill_temp(TINY_LLAMA, BF16, "flash")
    # alive per token: embeddings (kept by the model's forward) 2·8, layer input 2·8, norm output 2·8, ids 8 = 56;
    # per position: position ids 8 + RoPE cos/sin 2·4·2 = 24
    # attention: + Q,K,V 2·16 + SDPA output 2·8
    assert attn == Term(tok=56 + 32 + 16, pos=24)
    # MLP: + post-attention residual 2·8 + SiLU, up, product 3·2·16
    assert mlp == Term(tok=56 + 16 + 96, pos=24)
    # after the layers: embeddings, final norm output, ids; last-position logits bf16 + fp32 copy 32·6
    assert logits == Term(tok=16 + 16 + 8, seq=32 * 6, pos=24)


def test_prefill_moe_grouped_experts():
    moe = replace(TINY_LLAMA, num_experts=4, experts_per_token=2)
    _, mlp, _ = act.prefill_temp(moe, BF16, "flash")
    # per routed token: gathered input 2·8, gate_up 2·32 + SiLU 2·16 + product 2·16, sort ids 2·8, weight 2;
    # per token: fp32 router softmax 4·4, top-k values and indices 2·(4 + 8)
    assert mlp.tok == 56 + 16 + 2 * (16 + 128 + 16 + 2) + 16 + 24


@pytest.mark.parametrize("attention", ["flash", "eager"])
def test_checkpointing_never_adds_saved_activations(attention):
    for p in (FP32, BF16):
        none = act.train_activations(TINY_GPT2, p, attention, "none").saved
        sel = act.train_activations(TINY_GPT2, p, attention, "selective").saved
        full = act.train_activations(TINY_GPT2, p, attention, "full").saved
        assert full.tok <= sel.tok <= none.tok and full.s2 <= sel.s2 <= none.s2


def test_cpu_dropout_keeps_noise_in_the_input_dtype():
    # CUDA's native_dropout saves a bool mask (1 B); the CPU path saves the scaled Bernoulli noise in the input
    # dtype (2 B in bf16): two hidden-dropout masks of h and the attention-probability mask of a·s per token
    arch = replace(TINY_GPT2, hidden=64, heads=4, head_dim=16, kv_heads=4, intermediate=256)
    cpu = act.layer_saved(arch, BF16, "eager", device="cpu")
    assert cpu == Term(tok=34 * 64 + 16 + 2 * (2 - 1) * 64, s2=(5 + 1) * 4)


def test_autocast_linears_each_save_their_own_cast_of_a_shared_fp32_input():
    # bf16-mixed: the fp32 RMSNorm output is cast to bf16 separately by q, k and v (3 x 2·8) and by gate and up
    # (2 x 2·8); measured with saved_tensors_hooks on a real CPU LlamaForCausalLM under autocast
    mixed = get_precision("bf16-mixed")
    flash_bf16 = act.attention_saved(TINY_LLAMA, BF16, "flash").tok
    assert act.attention_saved(TINY_LLAMA, mixed, "flash").tok - flash_bf16 == 2 * 2 * 8
    assert act.mlp_saved(TINY_LLAMA, mixed).tok - act.mlp_saved(TINY_LLAMA, BF16).tok == 1 * 2 * 8
    # GPT-2's single c_attn and c_fc read their input once
    assert act.attention_saved(TINY_GPT2, mixed, "flash").tok == act.attention_saved(TINY_GPT2, BF16, "flash").tok
