"""Models whose estimate is derived from their own code (issue 12): the Architecture of kind "derived".

Any Hugging Face config whose model_type has no hand-written reader (models/hf.py), any preset of such a family,
and any importable torch.nn.Module factory (`model: {module: "torchvision.models:resnet50", kwargs: {...},
input_shape: [3, 224, 224]}`) become one. Its size fields come from the model card (derive/card.py: the built
model's parameters and the config's standard fields); its memory comes from traced plans (derive/), evaluated by
components/derived.py. Reading the card builds the model once under FakeTensorMode (seconds), or reads it from
the derived-plan cache.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any

from .. import columns as C
from ..models.arch import Architecture
from .source import ModelSource


@dataclass(frozen=True)
class DerivedModel:
    """What Architecture.derived holds: the source and its card (hashable: both are frozen)."""

    source: Any  # derive.ModelSource
    card: Any  # derive.ModelCard


def architecture_from_source(source, name: str = "", preset: str = "", origin: str = "") -> Architecture:
    """The Architecture of a derived model. Raises derive.DerivationError (one line) when the model cannot be
    built or the card cannot be read (e.g. torch missing and nothing cached)."""
    from . import get_card

    card = get_card(source)
    f = dict(card.fields)
    display = name or (source.spec.get("_name") if source.kind == "hf" else "") or card.class_name
    return Architecture(
        name=display, kind="derived", family=card.model_type, preset=preset,
        hidden=f.get("hidden", 0), layers=f.get("layers", 0), heads=f.get("heads", 0),
        kv_heads=f.get("kv_heads", 0), head_dim=f.get("head_dim", 0), intermediate=f.get("intermediate", 0),
        vocab=f.get("vocab", 0), max_position=f.get("max_position", 0), num_experts=f.get("num_experts", 0),
        experts_per_token=f.get("experts_per_token", 0), sliding_window=f.get("sliding_window") or None,
        params=card.params, largest_layer_params=card.largest_block_params,
        input_shape=tuple(source.spec.get("input_shape", ())) if source.kind == "module" else (),
        origin=origin or source.origin, derived=DerivedModel(source, card),
    )


def hf_source(cfg: dict[str, Any], origin: str) -> Any:
    """A ModelSource for a config.json dict (our `_nnmem` key removed)."""
    d = {k: v for k, v in cfg.items() if k != "_nnmem"}
    return ModelSource.of("hf", d, origin)


def module_source(spec: dict[str, Any], origin: str) -> Any:
    return ModelSource.of("module", spec, origin)


def architecture_of(req, stack: dict[str, str] | None = None) -> Architecture:
    """The Architecture of a models.resolve.DerivedModelSpec (raises DerivationError, one line); `stack`: releases
    of transformers / peft other than the installed ones its code is traced with (side.py)."""
    source = ModelSource.of(req.kind, req.spec, req.origin, req.decoder_seq_len, stack=stack)
    if req.decoder_seq_len and not req.spec.get("is_encoder_decoder"):
        from .source import DerivationError

        raise DerivationError("decoder_seq_len applies to encoder-decoder models (config is_encoder_decoder: true)")
    return architecture_from_source(source, name=req.name, preset=req.preset, origin=req.origin)


def derived_twin(arch: Architecture, allow_deriving: bool = False) -> Architecture | None:
    """The derived Architecture of a hand-modelled preset (None when it has none, or, unless allow_deriving, when
    its card is not stored): its traced allocation sequences stand for the hand model's. A derived model is its own
    twin. A hand-modelled LoRA is twinned by the derived base with the same adapters (with_adapters)."""
    from pathlib import Path

    from ..models.resolve import ModelSpecError, resolve_model
    from . import DerivationError, stored_only

    if arch.kind == "derived":
        return arch
    if not arch.preset or arch.kind not in ("transformer", "moe"):
        return None
    try:
        spec = resolve_model({"preset": arch.preset, "derive": True}, Path("."))
        with contextlib.nullcontext() if allow_deriving else stored_only():
            twin = architecture_of(spec)
            if arch.finetune is not None and arch.finetune.adapters:
                twin = with_adapters(twin, arch.finetune, peft_spec(arch.finetune))
            return twin
    except (DerivationError, ModelSpecError, ValueError):
        return None


def with_adapters(arch: Architecture, finetune: Any, spec: dict[str, Any]) -> Architecture:
    """A derived model with peft's adapters on it (spec: workload/build.py wrap_lora's): a model of its own, its
    card and plans traced with the adapters (raises DerivationError, one line, where peft cannot wrap it).
    `finetune` (a components Finetune) is kept on the Architecture for the report."""
    import dataclasses

    source = arch.derived.source.with_finetune(spec)
    out = architecture_from_source(source, name=arch.name, preset=arch.preset, origin=arch.origin)
    return dataclasses.replace(out, finetune=finetune)


def with_preference(arch: Architecture, spec: dict[str, Any]) -> Architecture:
    """A derived model (with its adapters, if any) trained on preference pairs (workload/preference.py: loss,
    reference): a step of its own, traced so (raises DerivationError, one line)."""
    import dataclasses

    source = arch.derived.source.with_preference(spec)
    out = architecture_from_source(source, name=arch.name, preset=arch.preset, origin=arch.origin)
    return dataclasses.replace(out, finetune=arch.finetune)


def peft_spec(ft: Any) -> dict[str, Any]:
    """A fine-tune's adapters (a components Finetune) as workload/build.py's wrap_lora takes them."""
    return {"method": ft.method, "rank": ft.rank, "alpha": ft.alpha, "dropout": ft.dropout,
            "targets": list(ft.targets) or None, "adapter_dtype": ft.adapter_dtype,
            "modules_to_save": list(ft.modules_to_save) or None}


def sharded(arch: Architecture, world: int, stage: int, version: int = 2, offload: bool = False,
            prefetch: str = "pre") -> Architecture:
    """One rank of a derived model's step sharded by FSDP over `world` ranks (zero_stage 2: SHARD_GRAD_OP, 3:
    FULL_SHARD; workload/fsdp.py): plans of its own (that step traced on the fake process group), and its card's
    tensors the rank's shards, which the optimizer's catalogs read (the optimizer steps the rank's shards): FSDP2's
    Shard(0), ceil(rows / world) rows of each tensor; FSDP1's (version 1) flat parameters, one per decoder block and
    one for the rest (the root), ceil(elements / world) each. `offload`: FSDP1's CPUOffload(offload_params=True)
    (workload/fsdp.py), the traced plans the GPU's side of that step. `prefetch` "none": FSDP1 without backward
    prefetch (workload/fsdp.py)."""
    import dataclasses

    card = arch.derived.card
    if version == 1:
        tensors = _flat_shards(card.tensors, world)
    else:
        tensors = tuple(dataclasses.replace(t, shape=(-(-t.shape[0] // world), *t.shape[1:])) if t.shape else t
                        for t in card.tensors)
    params = sum(t.count * math.prod(t.shape) for t in tensors)
    rank = dataclasses.replace(card, tensors=tensors, params=params)
    # FSDP2's spec as it always was (the shipped plans are keyed by it); FSDP1 names its version
    source = arch.derived.source.with_fsdp({"world": int(world), "zero_stage": int(stage),
                                            **({"version": 1} if version == 1 else {}),
                                            **({"offload": C.OFFLOAD_PARAMS} if offload else {}),
                                            **({"backward_prefetch": "none"} if prefetch == "none" else {})})
    return dataclasses.replace(arch, derived=dataclasses.replace(arch.derived, source=source, card=rank))


def _flat_shards(tensors: tuple, world: int) -> tuple:
    """FSDP1's flat parameters on one rank (use_orig_params False, a unit per decoder block and the root): the
    blocks' tensors (the card's repeated ones, `*` in their names) flattened into one per block, the rest into the
    root's, each padded to a multiple of `world` and cut into `world` shards. Under peft's adapters (a frozen base)
    the wrap the Trainer takes (peft's fsdp_auto_wrap_policy): every trainable leaf module a unit of its own, so each
    trainable tensor is a flat parameter of its own (its module's bias, where it has one, counted apart), and the
    flat ones of the blocks and the root hold the frozen tensors alone."""
    import dataclasses

    from .card import TensorInfo

    frozen = [t for t in tensors if not t.trainable]
    base = frozen if frozen else list(tensors)
    blocks = [t for t in base if "*" in t.name]
    n_blocks = max((t.count for t in blocks), default=0)
    block = -(-sum(t.count * math.prod(t.shape) for t in blocks) // n_blocks) if n_blocks else 0
    root = sum(t.count * math.prod(t.shape) for t in base if "*" not in t.name)
    out = [TensorInfo(name="_fsdp_wrapped_module.flat_param", shape=(-(-root // world),), trainable=not frozen)]
    if block:
        out.append(TensorInfo(name="layers.*._fsdp_wrapped_module.flat_param", shape=(-(-block // world),),
                              count=n_blocks, trainable=not frozen))
    if frozen:
        out += [dataclasses.replace(t, shape=(-(-math.prod(t.shape) // world),)) for t in tensors if t.trainable]
    return tuple(out)
