"""What the estimator needs to know about a derived model besides its traced moments: its parameter tensors
(the optimizer catalog's per-tensor rules, quantised recipes), its size figures, and names for the report.

Read from the model itself, built under FakeTensorMode (no memory, no download): every parameter tensor once
(tied weights once), which of them are matmul weights inside the repeated blocks (the ones quantised inference
recipes store in int8/int4/nf4/fp8, as vLLM and bitsandbytes quantise every Linear but the output head), the
largest repeated block (ZeRO-3 gathers one at a time), and the config's standard size fields where it has them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import source as src

# config fields read for display and for the throughput and serving figures; a text_config is read first
_FIELDS = {
    "hidden": ("hidden_size", "n_embd", "d_model"),
    "layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "heads": ("num_attention_heads", "n_head", "num_heads"),
    "kv_heads": ("num_key_value_heads",),
    "head_dim": ("head_dim",),
    "intermediate": ("intermediate_size", "n_inner", "d_ff", "ffn_dim"),
    "vocab": ("vocab_size",),
    "max_position": ("max_position_embeddings", "n_positions"),
    "num_experts": ("num_local_experts", "num_experts", "n_routed_experts"),
    "experts_per_token": ("num_experts_per_tok", "moe_topk"),
    "sliding_window": ("sliding_window",),
}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    count: int = 1
    block_linear: bool = False  # a matmul weight inside a repeated block (quantised by int8/int4/nf4/fp8)
    matmul: bool = False
    trainable: bool = True  # requires_grad (False: a frozen base weight under peft's adapters)
    adapter: bool = False  # one of peft's LoRA tensors (lora_A, lora_B): the adapter dtype, never quantised


@dataclass(frozen=True)
class ModelCard:
    class_name: str
    model_type: str
    params: int  # parameters, tied ones once (frozen ones too: adapters' base)
    tensors: tuple[TensorInfo, ...]
    largest_block_params: int  # the largest module of the largest ModuleList (a decoder layer): ZeRO-3's unit
    fields: tuple[tuple[str, int], ...] = field(default_factory=tuple)  # (name, value) of _FIELDS present

    def get(self, name: str, default: int = 0) -> int:
        return dict(self.fields).get(name, default)

    def to_json(self) -> dict[str, Any]:
        return {"class_name": self.class_name, "model_type": self.model_type, "params": self.params,
                "largest_block_params": self.largest_block_params, "fields": dict(self.fields),
                "tensors": [[t.name, list(t.shape), t.count, t.block_linear, t.matmul]
                            + ([t.trainable, t.adapter] if not t.trainable or t.adapter else [])
                            for t in self.tensors]}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "ModelCard":
        return cls(d["class_name"], d["model_type"], int(d["params"]),
                   tuple(TensorInfo(t[0], tuple(t[1]), *t[2:]) for t in d["tensors"]),
                   int(d["largest_block_params"]), tuple(sorted((k, int(v)) for k, v in d["fields"].items())))

    @property
    def frozen(self) -> bool:
        """Some parameters are frozen (a base under peft's adapters)."""
        return any(not t.trainable for t in self.tensors)


def _config_fields(cfg: dict[str, Any]) -> tuple[tuple[str, int], ...]:
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}
    out = {}
    for name, keys in _FIELDS.items():
        for d in (text, cfg):
            v = next((d[k] for k in keys if isinstance(d.get(k), int) and not isinstance(d.get(k), bool)), None)
            if v is not None:
                out[name] = int(v)
                break
    if "heads" in out and "kv_heads" not in out:
        out["kv_heads"] = out["heads"]
    if "hidden" in out and "heads" in out and "head_dim" not in out and out["hidden"] % out["heads"] == 0:
        out["head_dim"] = out["hidden"] // out["heads"]
    return tuple(sorted(out.items()))


def model_card(source: src.ModelSource) -> ModelCard:
    """Build the model (fp32, fake) and read its card."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    with src.quiet(), FakeTensorMode():
        model, _ = src.build(source, src.case(source, "train", "fp32", "eager", "none", "cuda"))  # any kernel
    head = None
    get_head = getattr(model, "get_output_embeddings", None)
    if callable(get_head):
        head = get_head()
    head_params = {id(p) for p in head.parameters()} if isinstance(head, torch.nn.Module) else set()
    # parameters inside a repeated block: those of the elements of the largest ModuleList
    block_params: set[int] = set()
    largest = 0
    for mod in model.modules():
        if isinstance(mod, torch.nn.ModuleList) and len(mod) > 1:
            for child in mod:
                ps = list(child.parameters())
                block_params.update(id(p) for p in ps)
                largest = max(largest, sum(p.numel() for p in ps))
    linear_weights = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Linear)}
    embed_weights = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    tensors, seen = [], set()
    for name, p in model.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        in_block = id(p) in block_params and id(p) not in head_params
        adapter = ".lora_" in name  # peft's LoRA A and B (lora_A, lora_B, lora_embedding_*)
        # matmul weights of the blocks: nn.Linear weights, and the 3-D expert tensors of fused MoE layers
        block_linear = in_block and not adapter and (id(p) in linear_weights or (p.dim() == 3 and "expert" in name))
        matmul = id(p) in linear_weights or id(p) in head_params or block_linear or \
            (id(p) in embed_weights and head is not None and getattr(head, "weight", None) is p)
        # a 4-bit weight (QLoRA, workload/qlora.py) by the matrix it holds, not its packed bytes' shape
        shape = getattr(getattr(p, "quant_state", None), "shape", None) or p.shape
        tensors.append(TensorInfo(name, tuple(int(d) for d in shape), 1, block_linear, matmul,
                                  bool(p.requires_grad), adapter))
    params = sum(_numel(t.shape) for t in tensors)
    cfg = source.spec if source.kind == "hf" else {}
    mtype = cfg.get("model_type", "") if source.kind == "hf" else "module"
    cls_name = (cfg.get("architectures") or [type(model).__name__])[0] if source.kind == "hf" else \
        source.spec["module"]
    return ModelCard(cls_name, mtype, params, _merge(tensors), largest or 0, _config_fields(cfg))


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _merge(tensors: list[TensorInfo]) -> tuple[TensorInfo, ...]:
    """Tensors of the same shape and flags become one entry with a count (names: the first one's, with the
    block index replaced by '*'), which keeps the card small for 100-layer models."""
    import re

    groups: dict[tuple, list[TensorInfo]] = {}
    for t in tensors:
        key = (re.sub(r"\.\d+\.", ".*.", t.name), t.shape, t.block_linear, t.matmul, t.trainable, t.adapter)
        groups.setdefault(key, []).append(t)
    return tuple(TensorInfo(k[0], k[1], len(v), k[2], k[3], k[4], k[5]) for k, v in groups.items())
