"""What a derived plan is derived from: a Hugging Face config (any class transformers can build) or an importable
torch.nn.Module factory, and how it is built and fed for one recipe.

The workload is the one `nnmem-sweep measure` runs (measure/build.py): the same model construction (random init
under FakeTensorMode, the recipe's dtype set as the default dtype around construction, SDPA for attention=flash,
eager otherwise, non-reentrant activation checkpointing for checkpointing=full), the same inputs and loss.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
from dataclasses import dataclass
from typing import Any

# recipe name -> (dtype the model is built in, autocast dtype or None), as torch dtype names. Recipes that are
# not a way of running PyTorch (bf16-master keeps an fp32 master copy beside a bf16 model; the quantised
# inference recipes store weights that the kernels dequantise) are traced as the bf16 model; their extra or
# smaller weights come from the precision catalog.
TRACE_RECIPE = {
    "fp32": "fp32", "bf16": "bf16", "fp16": "fp16", "bf16-mixed": "bf16-mixed", "fp16-mixed": "fp16-mixed",
    "bf16-master": "bf16", "int8": "bf16", "int4": "bf16", "nf4": "bf16", "fp8": "bf16",
}
_DTYPES = {"fp32": ("float32", None), "bf16": ("bfloat16", None), "fp16": ("float16", None),
           "bf16-mixed": ("float32", "bfloat16"), "fp16-mixed": ("float32", "float16")}


class DerivationError(ValueError):
    """The model cannot be derived (not buildable, not polynomial in the shape, ...): one line for the user."""


@dataclass(frozen=True)
class ModelSource:
    """kind "hf": spec = the config.json dict; kind "module": spec = {"module": "pkg.mod:factory", "kwargs": {...},
    "input_shape": [...], "num_classes": n}. Stored as canonical JSON so the dataclass hashes."""

    kind: str
    spec_json: str
    origin: str = ""

    @classmethod
    def of(cls, kind: str, spec: dict[str, Any], origin: str = "") -> "ModelSource":
        return cls(kind, json.dumps(spec, sort_keys=True, separators=(",", ":")), origin)

    @property
    def spec(self) -> dict[str, Any]:
        return json.loads(self.spec_json)

    def digest(self) -> str:
        return hashlib.sha256(f"{self.kind}\n{self.spec_json}".encode()).hexdigest()

    @property
    def sequence(self) -> bool:
        """Whether the inputs have a sequence axis (transformers) or not (image models: s does not matter)."""
        return self.kind == "hf" and not _is_image(self.spec)


def _is_image(cfg: dict[str, Any]) -> bool:
    arch = (cfg.get("architectures") or [""])[0]
    return arch.endswith("ForImageClassification")


def torch_dtypes(recipe: str):
    import torch

    model, amp = _DTYPES[recipe]
    return getattr(torch, model), (getattr(torch, amp) if amp else None)


def build(source: ModelSource, recipe: str, attention: str, checkpointing: str, train: bool):
    """The model for a trace recipe; call inside FakeTensorMode."""
    from ..measure.build import build_hf_model, default_dtype

    dtype, _ = torch_dtypes(recipe)
    with default_dtype(dtype):
        if source.kind == "hf":
            return build_hf_model(dict(source.spec), attention, checkpointing, train)
        spec = source.spec
        mod, _, fn = spec["module"].partition(":")
        try:
            factory = getattr(importlib.import_module(mod), fn)
        except (ImportError, AttributeError) as e:
            raise DerivationError(f"cannot import {spec['module']!r}: {e}") from None
        if checkpointing != "none":
            raise DerivationError("checkpointing is modelled for transformers models only (module: models run "
                                  "without it)")
        return factory(**spec.get("kwargs", {}))


def inputs(source: ModelSource, model, b: int, s: int, train: bool) -> tuple[dict, Any]:
    """(inputs, loss_fn or None) at batch b and sequence s; call inside FakeTensorMode."""
    import torch

    if source.kind == "module":
        spec = source.spec
        n_cls = int(spec.get("num_classes", spec.get("kwargs", {}).get("num_classes", 1000)))
        x = torch.randn((b, *spec["input_shape"]))
        y = torch.randint(0, n_cls, (b,))

        def loss_fn(m, inp):
            return torch.nn.functional.cross_entropy(m(inp["x"]), inp["y"])

        return {"x": x, "y": y}, loss_fn
    from ..measure.build import _lm_inputs

    cfg = source.spec
    case = {"batch": b, "seq_len": s, "mode": "train" if train else "infer"}
    return _lm_inputs(case, cfg, cfg["architectures"][0]), None


@contextlib.contextmanager
def quiet():
    """transformers' one-line notices (loss_type ...) are not for our users."""
    import logging

    log = logging.getLogger("transformers")
    old = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(old)
