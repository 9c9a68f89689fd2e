"""What the estimator needs to know about a model: one frozen dataclass for every way a model can be named.

kind = "transformer": a decoder/encoder stack described by HF-config quantities (presets, hf_config, explicit fields).
kind = "params":      a plain parameter count plus activation elements (the simple calculators' model).
kind = "layers":      a CNN/MLP layer list, counted layer by layer (see `layer_table`).
kind = "derived":     any model PyTorch can build; its memory comes from traces of its own code (models/derived.py,
                      derive/): `derived` holds the source and the model card; the size fields are the config's.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class LayerRecord:
    """One layer of a layer-list net, after shape inference."""

    name: str  # e.g. "conv2d_1"
    type: str  # conv2d | linear | maxpool2d | avgpool2d | batchnorm2d | relu | gelu | flatten | dropout | ...
    output_shape: tuple[int, ...]  # per sample (no batch dim), e.g. (64, 112, 112)
    params: int
    output_elements: int  # product of output_shape
    weight_params: int = 0  # elements of the conv kernel / linear matrix (biases, norm scales excluded)


@dataclass(frozen=True)
class Architecture:
    name: str  # display name, e.g. "Llama 3.1 8B"
    kind: str  # "transformer" | "params" | "layers" | "derived"
    family: str = ""  # gpt2 | bert | llama | mistral | qwen2 | mixtral | params | layers
    preset: str = ""  # preset id when named by preset, e.g. "llama-3.1-8b"

    # --- transformer quantities (HF config names in comments) ---
    hidden: int = 0  # hidden_size / n_embd
    layers: int = 0  # num_hidden_layers / n_layer
    heads: int = 0  # num_attention_heads / n_head
    kv_heads: int = 0  # num_key_value_heads (== heads without GQA)
    head_dim: int = 0  # head_dim (hidden // heads unless given)
    intermediate: int = 0  # intermediate_size / n_inner (4*hidden for GPT-2 when null)
    vocab: int = 0  # vocab_size
    max_position: int = 0  # max_position_embeddings / n_positions
    type_vocab: int = 0  # BERT token_type embeddings
    tied_embeddings: bool = False  # tie_word_embeddings
    mlp: str = "gelu"  # "gelu": up/down (2 matrices) | "gated": gate/up/down (3 matrices, SwiGLU)
    activation: str = "gelu"  # hidden_act / activation_function
    norm: str = "layernorm"  # layernorm | rmsnorm
    position: str = "learned"  # learned | rope
    qkv_bias: bool = False
    attn_out_bias: bool = False
    mlp_bias: bool = False
    norm_bias: bool = False  # LayerNorm has a bias; RMSNorm does not
    attn_dropout: float = 0.0
    hidden_dropout: float = 0.0  # residual / embedding dropout
    num_experts: int = 0  # num_local_experts (0 = dense)
    experts_per_token: int = 0  # num_experts_per_tok
    sliding_window: int | None = None
    head: str = "causal_lm"  # causal_lm | masked_lm | seq_cls | base  (decided by `architectures`)
    num_labels: int = 2  # seq_cls head width

    # --- totals (computed for transformers; given for params models; summed for layer nets) ---
    params: int = 0  # total trainable parameters (tied embeddings counted once)
    largest_layer_params: int = 0  # for ZeRO-3 gather buffers (DeepSpeed estimator)
    # params models: activation elements kept for backward, per sample or per token
    activation_elements_per_sample: int = 0
    activation_elements_per_token: int = 0
    # layer nets
    input_shape: tuple[int, ...] = ()
    layer_table: tuple[LayerRecord, ...] = field(default_factory=tuple)

    # where the description came from (preset file, hf config path, "explicit")
    origin: str = ""
    # how the model is trained (scenario `finetune:`): a components.finetune_method.Finetune; None = every parameter trained.
    # Part of the architecture so that every estimator path (grid, max batch, stream, accuracy) sees the same model.
    finetune: Any = None
    # kind "derived": a models.derived.DerivedModel (the model source and its card); None otherwise
    derived: Any = None
