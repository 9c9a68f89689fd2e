"""What a case feeds its model: one function, `make_inputs`, for `measure` and for the derive package's probes alike,
so a plan derived at small probe shapes runs exactly the workload that `measure` runs at the case's shape.

The input kind follows from the model (its config and the class named in `architectures`), not from a family list:

  kind         inputs (train)                              inputs (infer)           infer workload
  causal_lm    input_ids (b, s), labels = a copy           input_ids                prefill + decode (generate())
  masked_lm    input_ids (b, s), labels = a copy           input_ids                one no_grad forward
  seq_cls      input_ids (b, s), labels (b,)               input_ids                one no_grad forward
  seq2seq      input_ids (b, s), labels (b, s_dec)         input_ids (b, s)         encoder once, decoder prefill
                                                                                    of the start token, decode steps
  image_cls    pixel_values (b, C, H, W), labels (b,)      pixel_values             one no_grad forward
  module       x (b, *input_shape), y (b,) for the loss    x                        one no_grad forward

seq2seq: the model shifts `labels` right into `decoder_input_ids` (T5's `_shift_right`); s_dec is the case's
`decoder_seq_len`, else s. Every tensor is created in the default dtype set around construction (the model's
dtype: a bf16 model gets bf16 pixel_values, as a pipeline casting its images to the model does); ids and labels
are int64.
"""
from __future__ import annotations

from typing import Any

import torch

KINDS = ("causal_lm", "masked_lm", "seq_cls", "seq2seq", "image_cls", "module")
# kinds whose inference is generate(): a prefill that fills a KV cache, then one-token decode steps
GENERATIVE = ("causal_lm", "seq2seq")


def input_kind(case: dict[str, Any], model: torch.nn.Module) -> str:
    """The input kind of a built model (see the module docstring)."""
    if "layers" in case or "module" in case:
        return "module"
    from torch.distributed.fsdp import FullyShardedDataParallel

    if isinstance(model, FullyShardedDataParallel):  # FSDP1's root unit (workload/fsdp.py): the head is the module's
        model = model.module
    if hasattr(model, "get_base_model"):  # a peft wrapper (LoRA): the head is the wrapped model's
        model = model.get_base_model()
    config = model.config
    head = type(model).__name__
    if getattr(config, "is_encoder_decoder", False):
        return "seq2seq"
    if head.endswith("ForImageClassification"):
        return "image_cls"
    if head.endswith("ForSequenceClassification"):
        return "seq_cls"
    if head.endswith("ForMaskedLM"):
        return "masked_lm"
    if head.endswith(("ForCausalLM", "LMHeadModel")):
        return "causal_lm"
    raise ValueError(f"cannot feed {head}: supported heads are …ForCausalLM / …LMHeadModel, …ForMaskedLM, "
                     "…ForSequenceClassification, …ForConditionalGeneration (encoder-decoder), "
                     "…ForImageClassification, or a `module:` factory")


def _classes(case: dict[str, Any], model: torch.nn.Module) -> int:
    if "layers" in case:
        return int(case["num_classes"])
    if "module" in case:
        return int((case.get("kwargs") or {}).get("num_classes", 1000))
    return int(model.config.num_labels)


def make_inputs(case: dict[str, Any], cfg: dict[str, Any], model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The inputs of one training step or one request: batch `case["batch"]`, sequence `case["seq_len"]`
    (`decoder_seq_len` for an encoder-decoder's labels). Call it where the model was built (inside the fake mode
    and the default-dtype context when measuring)."""
    del cfg  # the built model's config is the authority (num_labels, image size, vocabulary)
    kind = input_kind(case, model)
    train = case["mode"] == "train"
    b = int(case["batch"])
    if kind == "module":
        x = torch.randn((b, *(int(d) for d in case["input_shape"])))
        return {"x": x, "y": torch.randint(0, _classes(case, model), (b,))} if train else {"x": x}
    if kind == "image_cls":
        c = model.config
        size = c.image_size if isinstance(c.image_size, (tuple, list)) else (c.image_size, c.image_size)
        pixels = torch.randn((b, int(c.num_channels), int(size[0]), int(size[1])))
        if not train:
            return {"pixel_values": pixels}
        return {"pixel_values": pixels, "labels": torch.randint(0, _classes(case, model), (b,))}
    s = int(case["seq_len"])
    vocab = int(model.config.get_text_config(decoder=True).vocab_size)
    ids = torch.randint(0, vocab, (b, s), dtype=torch.long)
    if not train:
        return {"input_ids": ids}
    if kind == "seq_cls":
        return {"input_ids": ids, "labels": torch.randint(0, _classes(case, model), (b,), dtype=torch.long)}
    if kind == "seq2seq":
        s_dec = int(case.get("decoder_seq_len") or s)
        return {"input_ids": ids, "labels": torch.randint(0, vocab, (b, s_dec), dtype=torch.long)}
    # the collator's labels are a copy of the input ids (masked LM: the same shape, -100 where not masked)
    return {"input_ids": ids, "labels": ids.clone()}


def module_loss(model: torch.nn.Module, inputs: dict[str, Any]) -> torch.Tensor:
    """The training loss of a plain nn.Module classifier (a layer list, a torchvision model): cross-entropy of its
    output against `y`."""
    return torch.nn.functional.cross_entropy(model(inputs["x"]), inputs["y"])
