"""What a derived plan is derived from: a Hugging Face config (any class transformers can build) or an importable
torch.nn.Module factory, and how it is built and fed for one recipe.

The workload is the one `nnmem-sweep measure` runs (measure/build.py): the same model construction (random init
under FakeTensorMode, the recipe's dtype set as the default dtype around construction, SDPA for attention=flash,
eager otherwise, non-reentrant activation checkpointing for checkpointing=full), the same inputs and loss.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import dataclass
from typing import Any

# recipe name -> the recipe its trace runs (measure/build.py builds it: the model's dtype and autocast). Recipes that
# are not a way of running PyTorch (bf16-master keeps an fp32 master copy beside a bf16 model; the quantised
# inference recipes store weights that the kernels dequantise) are traced as the bf16 model; their extra or
# smaller weights come from the precision catalog.
TRACE_RECIPE = {
    "fp32": "fp32", "bf16": "bf16", "fp16": "fp16", "bf16-mixed": "bf16-mixed", "fp16-mixed": "fp16-mixed",
    "bf16-master": "bf16", "int8": "bf16", "int4": "bf16", "nf4": "bf16", "fp8": "bf16",
}


# The trace recipe's suffix for a training step whose gradients were kept from the step before (zero_grad "zeros":
# optimizer.zero_grad(set_to_none=False)): step.run gives every trainable parameter a zeroed .grad first.
KEPT_GRADIENTS = "+zeros"
# ... and for a sharded step synced only at the last micro-batch (FSDP2's set_requires_gradient_sync(False) before,
# accelerate's no_sync): step.run runs one unsynced micro-batch first, so the traced last one starts with the whole
# unsharded gradients and reduce-scatters them
UNSYNCED_GRADIENTS = "+nosync"
KEPT_SUFFIXES = {"zeros": KEPT_GRADIENTS, "nosync": UNSYNCED_GRADIENTS}


class DerivationError(ValueError):
    """The model cannot be derived (not buildable, not polynomial in the shape, ...): one line for the user."""


@dataclass(frozen=True)
class ModelSource:
    """kind "hf": spec = the config.json dict; kind "module": spec = {"module": "pkg.mod:factory", "kwargs": {...},
    "input_shape": [...], "num_classes": n}. Stored as canonical JSON so the dataclass hashes."""

    kind: str
    spec_json: str
    origin: str = ""
    decoder_seq_len: int = 0  # encoder-decoders: a fixed decoder length (0: the encoder's, s)
    # peft's adapters on the model (workload/build.py wrap_lora's spec: rank, alpha, dropout, targets, adapter_dtype,
    # modules_to_save), as canonical JSON; "" for the model as it is. A model with adapters is a model of its own:
    # its card and plans are its own.
    finetune_json: str = ""
    # preference tuning's step (workload/preference.py: loss, reference) as canonical JSON; "" for a plain step
    preference_json: str = ""
    # one rank of the step sharded by FSDP2 (workload/fsdp.py: world, zero_stage) as canonical JSON; "" on one GPU
    fsdp_json: str = ""
    # the releases the model's code is traced with where they are not the installed ones (runtime.transformers,
    # runtime.peft; derive/side.py) as canonical JSON; "" for the installed releases
    stack_json: str = ""

    @classmethod
    def of(cls, kind: str, spec: dict[str, Any], origin: str = "", decoder_seq_len: int = 0,
           finetune: dict[str, Any] | None = None, preference: dict[str, Any] | None = None,
           fsdp: dict[str, Any] | None = None, stack: dict[str, str] | None = None) -> "ModelSource":
        ft = json.dumps(finetune, sort_keys=True, separators=(",", ":")) if finetune else ""
        pref = json.dumps(preference, sort_keys=True, separators=(",", ":")) if preference else ""
        return cls(kind, json.dumps(spec, sort_keys=True, separators=(",", ":")), origin, int(decoder_seq_len), ft,
                   pref, json.dumps(fsdp, sort_keys=True, separators=(",", ":")) if fsdp else "",
                   json.dumps(stack, sort_keys=True, separators=(",", ":")) if stack else "")

    @property
    def spec(self) -> dict[str, Any]:
        return json.loads(self.spec_json)

    @property
    def finetune(self) -> dict[str, Any] | None:
        return json.loads(self.finetune_json) if self.finetune_json else None

    @property
    def preference(self) -> dict[str, Any] | None:
        return json.loads(self.preference_json) if self.preference_json else None

    @property
    def fsdp(self) -> dict[str, Any] | None:
        return json.loads(self.fsdp_json) if self.fsdp_json else None

    @property
    def stack(self) -> dict[str, str]:
        return json.loads(self.stack_json) if self.stack_json else {}

    def with_finetune(self, finetune: dict[str, Any] | None) -> "ModelSource":
        """The same model with peft's adapters `finetune` (None: without)."""
        return ModelSource.of(self.kind, self.spec, self.origin, self.decoder_seq_len, finetune, self.preference,
                              self.fsdp, self.stack)

    def with_preference(self, preference: dict[str, Any] | None) -> "ModelSource":
        """The same model trained on preference pairs (workload/preference.py; None: a plain step)."""
        return ModelSource.of(self.kind, self.spec, self.origin, self.decoder_seq_len, self.finetune, preference,
                              self.fsdp, self.stack)

    def with_fsdp(self, fsdp: dict[str, Any] | None) -> "ModelSource":
        """One rank of the same step sharded by FSDP2 ({"world": d, "zero_stage": 2 | 3}; None: one GPU)."""
        return ModelSource.of(self.kind, self.spec, self.origin, self.decoder_seq_len, self.finetune,
                              self.preference, fsdp, self.stack)

    def digest(self) -> str:
        extra = f"\ndecoder_seq_len={self.decoder_seq_len}" if self.decoder_seq_len else ""
        extra += f"\nfinetune={self.finetune_json}" if self.finetune_json else ""
        extra += f"\npreference={self.preference_json}" if self.preference_json else ""
        extra += f"\nfsdp={self.fsdp_json}" if self.fsdp_json else ""
        extra += f"\nstack={self.stack_json}" if self.stack_json else ""
        return hashlib.sha256(f"{self.kind}\n{self.spec_json}{extra}".encode()).hexdigest()

    @property
    def sequence(self) -> bool:
        """Whether the inputs have a sequence axis (transformers) or not (image models: s does not matter)."""
        return self.kind == "hf" and not _is_image(self.spec)


def _is_image(cfg: dict[str, Any]) -> bool:
    arch = (cfg.get("architectures") or [""])[0]
    return arch.endswith("ForImageClassification")


def case(source: ModelSource, mode: str, recipe: str, attention: str, checkpointing: str, device: str,
         batch: int = 2, seq_len: int = 64) -> dict[str, Any]:
    """The `measure` case (measure/build.py) of one probe: the same dict `nnmem-sweep measure` runs. A recipe
    ending in KEPT_GRADIENTS ("bf16+zeros") traces the step with the gradients kept from the step before."""
    precision, kept = recipe, ""
    for zero_grad, suffix in KEPT_SUFFIXES.items():
        if recipe.endswith(suffix):
            precision, kept = recipe[:-len(suffix)], zero_grad
    c: dict[str, Any] = {"mode": mode, "batch": batch, "seq_len": seq_len, "precision": precision,
                         "attention": attention, "checkpointing": checkpointing,
                         "optimizer": "none", "optimizer_impl": "foreach", "decode_tokens": 0}
    if kept:
        c["zero_grad"] = kept
    if device == "cuda":
        c["dropout_impl"] = "native"  # CUDA's dropout keeps a 1-byte mask (workload/build.py native_dropout)
    if source.decoder_seq_len:
        c["decoder_seq_len"] = source.decoder_seq_len
    if source.finetune_json:
        c["finetune"] = source.finetune
    if source.preference_json and mode == "train":
        c["preference"] = source.preference
    if source.fsdp_json and mode == "train":
        c["fsdp"] = source.fsdp
    spec = source.spec
    if source.kind == "hf":
        c["hf_config"] = spec
    else:
        c.update({k: spec[k] for k in ("module", "kwargs", "input_shape") if k in spec})
    return c


def build(source: ModelSource, probe_case: dict[str, Any]):
    """The model of a case; call inside FakeTensorMode. A model transformers or the factory cannot build raises
    DerivationError (one line)."""
    from ..workload.build import build_model, case_config, default_dtype, model_dtype

    cfg, _ = case_config(probe_case)
    if source.kind == "hf":
        import transformers

        name = _what(source)
        if not isinstance(getattr(transformers, name, None), type):
            raise DerivationError(f"transformers {transformers.__version__} has no model class {name!r} "
                                  "(the config's architectures[0]); no remote code is run")
    try:
        with default_dtype(model_dtype(probe_case["precision"])):
            return build_model(probe_case, cfg), cfg
    except (ValueError, ImportError, AttributeError, TypeError, KeyError) as e:
        raise DerivationError(f"cannot build {_what(source)}: {type(e).__name__}: {e}") from None


def _what(source: ModelSource) -> str:
    spec = source.spec
    if source.kind == "hf":
        return str((spec.get("architectures") or [spec.get("model_type", "?")])[0])
    return str(spec.get("module"))


@contextlib.contextmanager
def quiet():
    """transformers' one-line notices (loss_type ...) and the libraries' warnings while a model is built and traced
    (FSDP1 asks a fake tensor for its data pointer: torch's deprecation warning, twice a trace) are not for our
    users."""
    import logging
    import warnings

    log = logging.getLogger("transformers")
    old = log.level
    log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        log.setLevel(old)
