"""QLoRA's frozen 4-bit base as bitsandbytes stores and runs it (Dettmers et al. 2023 §3; bitsandbytes 0.50), for
the measured and traced fine-tunes (build.wrap_lora with method qlora):

  - every nn.Linear but the output embedding (transformers' BitsAndBytesConfig skips lm_head) stored in NF4:
    bnb.functional.quantize_4bit itself makes the packed weight ((rows·cols + 1)//2 uint8) and its quant state (a
    uint8 absmax per 64 values, double-quantised: an fp32 absmax per 256 of those, the fp32 offset, the 16-entry
    NF4 table and the 256-entry dynamic table, each matrix its own copy), compute dtype the recipe's;
  - peft's prepare_model_for_kbit_training: every other fp16/bf16 parameter (embeddings, norms, lm_head) cast to
    fp32, the base frozen;
  - the matmul CUDA runs for a training step: MatMul4Bit keeps only the packed weight for backward; the forward
    (bitsandbytes backends/cuda/ops.py _dequant_linear_fallback, taken past 1536 rows, i.e. b·s > 1536) rebuilds the
    fp32 absmax, dequantizes the whole matrix to the compute dtype and calls F.linear; the backward dequantizes it
    again (bnb.functional.dequantize_4bit) for the input's gradient.

On a GPU (the GPU kit) the linears are bitsandbytes' own Linear4bit and its kernels run. Under FakeTensorMode (an
8B model at no cost; and on the CPU) bitsandbytes' Params4bit cannot wrap a FakeTensor, so the 4-bit linear is a bnb.nn.Linear4bit (peft dispatches its LoRA layer by that type) whose weight is a plain frozen
Parameter carrying the same quant state, and whose forward is the training path above through bitsandbytes' own
operators (their fake kernels give the shapes and dtypes). tests/test_qlora.py checks its storage against
bitsandbytes' real Linear4bit, byte for byte. Below 1536 rows bitsandbytes may pick a fused kernel that needs no
dequantized copy: the trace then counts one matrix too many, for a moment (the report's assumptions say so)."""
from __future__ import annotations

import contextlib
import logging
from typing import Iterator

import torch


BLOCKSIZE = 64  # BitsAndBytesConfig's bnb_4bit_blocksize default (QLoRA §3: 64 values per absmax)
QUANT_TYPE = "nf4"

# bitsandbytes warns on import (peft imports it) where its optional CPU kernels (the `kernels` package) are absent;
# nothing here runs them
logging.getLogger("bitsandbytes").setLevel(logging.ERROR)


def available() -> bool:
    """bitsandbytes importable (the `measure` extra installs it); QLoRA is then traced, else refused in one line."""
    import importlib.util

    return importlib.util.find_spec("bitsandbytes") is not None


def _bnb():
    import bitsandbytes

    return bitsandbytes


class _TrainingMatMul4bit(torch.autograd.Function):
    """bitsandbytes' MatMul4Bit as a training step on CUDA runs it (module docstring): nothing of the input saved."""

    @staticmethod
    def forward(ctx, A, B, bias, state):  # noqa: ANN001, ANN205
        ops = torch.ops.bitsandbytes
        absmax = state.absmax
        if state.nested:  # the per-block scales rebuilt in fp32 (two temporaries), as _dequant_linear_fallback does
            absmax_dq = ops.dequantize_blockwise.default(state.absmax, state.state2.absmax, state.state2.code,
                                                         state.state2.blocksize, torch.float32)
            absmax = absmax_dq + state.offset
        weight = ops.dequantize_4bit.default(B, absmax, state.blocksize, state.quant_type, state.shape, A.dtype)
        ctx.state, ctx.B = state, B
        return torch.nn.functional.linear(A, weight, bias)

    @staticmethod
    def backward(ctx, grad_output):  # noqa: ANN001, ANN205
        F = _bnb().functional
        grad_a = None
        if ctx.needs_input_grad[0]:  # MatMul4Bit.backward: the weight dequantized again for the input's gradient
            grad_a = torch.matmul(grad_output, F.dequantize_4bit(ctx.B, ctx.state).to(grad_output.dtype))
        return grad_a, None, None, None


def _linear4bit_class():
    bnb = _bnb()

    class TracedLinear4bit(bnb.nn.Linear4bit):
        """A bnb.nn.Linear4bit whose weight is a frozen uint8 Parameter with bitsandbytes' quant state (module
        docstring); forward as Linear4bit.forward: the input cast to the compute dtype, the output back to the
        input's dtype."""

        def __init__(self, linear: torch.nn.Linear, compute_dtype: torch.dtype,
                     storage: torch.dtype = torch.uint8):
            torch.nn.Module.__init__(self)
            self.in_features, self.out_features = linear.in_features, linear.out_features
            packed, state = bnb.functional.quantize_4bit(linear.weight.detach(), blocksize=BLOCKSIZE,
                                                         compress_statistics=True, quant_type=QUANT_TYPE,
                                                         quant_storage=storage)
            weight = torch.nn.Parameter(packed, requires_grad=False)
            for k, v in {"quant_state": state, "quant_type": QUANT_TYPE, "compress_statistics": True,
                         "blocksize": BLOCKSIZE, "quant_storage": storage, "bnb_quantized": True,
                         "module": self}.items():
                setattr(weight, k, v)
            self.weight = weight
            self.bias = None if linear.bias is None else torch.nn.Parameter(linear.bias.detach(), requires_grad=False)
            self.compute_dtype, self.compute_type_is_set = compute_dtype, True
            # on the module too, as bitsandbytes keeps it for FSDP (fix_4bit_weight_quant_state_from_module): a
            # sharded weight's unsharded copy is a new tensor without it
            self.quant_state, self.quant_storage = state, storage

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            inp_dtype = x.dtype
            x = x.to(self.compute_dtype)
            bias = None if self.bias is None else self.bias.to(self.compute_dtype)
            state = getattr(self.weight, "quant_state", None) or self.quant_state
            return _TrainingMatMul4bit.apply(x, self.weight, bias, state).to(inp_dtype)

    return TracedLinear4bit


def _on_cuda(linear: torch.nn.Linear, compute_dtype: torch.dtype, storage: torch.dtype) -> torch.nn.Module:
    """On a GPU (the GPU kit) bitsandbytes' own Linear4bit, quantized where it lies, its own kernels measured."""
    bnb = _bnb()
    q = bnb.nn.Linear4bit(linear.in_features, linear.out_features, bias=linear.bias is not None,
                          compute_dtype=compute_dtype, compress_statistics=True, quant_type=QUANT_TYPE,
                          quant_storage=storage, device=linear.weight.device)
    q.weight = bnb.nn.Params4bit(linear.weight.data, requires_grad=False, compress_statistics=True,
                                 quant_type=QUANT_TYPE, blocksize=BLOCKSIZE, quant_storage=storage)
    if linear.bias is not None:
        q.bias = torch.nn.Parameter(linear.bias.detach(), requires_grad=False)
    return q.to(linear.weight.device)


@contextlib.contextmanager
def _dynamic_table() -> Iterator[None]:
    """bitsandbytes caches its 256-entry dynamic table (the absmax's own quantisation) in a module dict on first
    use; made under FakeTensorMode it would outlive the mode. While quantizing, the table is the active mode's."""
    F = _bnb().functional
    saved = F.name2qmap.get("dynamic")
    from torch._subclasses.fake_tensor import FakeTensor

    fake = isinstance(torch.empty(0), FakeTensor)  # its values come from data-dependent ops: under fake, its shape
    F.name2qmap["dynamic"] = torch.empty(256, dtype=torch.float32) if fake else F.create_dynamic_map()
    try:
        yield
    finally:
        if saved is None:
            F.name2qmap.pop("dynamic", None)
        else:
            F.name2qmap["dynamic"] = saved


def quantize(model: torch.nn.Module, compute_dtype: torch.dtype,
             storage: torch.dtype = torch.uint8) -> torch.nn.Module:
    """Every nn.Linear of `model` but its output embedding in NF4 (in place), then prepare_model_for_kbit_training's
    fp32 cast and freeze (module docstring). Returns the model. `storage` a float dtype: FSDP-QLoRA as bitsandbytes,
    peft and TRL set it up for FSDP1 (which flattens a unit into one float dtype): bnb_4bit_quant_storage and the
    model's dtype alike, the packed bytes held as elements of that dtype, and no fp32 cast (TRL's SFTTrainer skips
    prepare_model_for_kbit_training for a sharded QLoRA): the base frozen in its own dtype."""
    cls = _linear4bit_class()
    skip = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    with _dynamic_table():
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                if type(child) is torch.nn.Linear and child is not skip:
                    four = _on_cuda(child, compute_dtype, storage) if child.weight.is_cuda else \
                        cls(child, compute_dtype, storage)
                    setattr(parent, name, four)
    cast: dict[int, torch.nn.Parameter] = {}  # prepare_model_for_kbit_training: frozen, the 16-bit rest in fp32
    for mod in model.modules():  # (a new Parameter per tensor, ties kept: Module.to cannot swap a fake one)
        for name, p in list(mod._parameters.items()):
            if p is None:
                continue
            if p.dtype in (torch.float16, torch.bfloat16) and storage == torch.uint8:
                if id(p) not in cast:
                    cast[id(p)] = torch.nn.Parameter(p.detach().to(torch.float32), requires_grad=False)
                p = mod._parameters[name] = cast[id(p)]
            p.requires_grad_(False)
    return model


def quant_state_tensors(model: torch.nn.Module) -> list[torch.Tensor]:
    """The tensors each 4-bit weight's quant state holds (not parameters or buffers: a tracker is told of them)."""
    out: list[torch.Tensor] = []
    states = {id(s): s for s in [*(getattr(p, "quant_state", None) for p in model.parameters()),
                                  *(getattr(m, "quant_state", None) for m in model.modules())]
              if s is not None and hasattr(s, "absmax")}
    for state in states.values():
        while state is not None:
            out += [t for t in (state.absmax, state.code, getattr(state, "offset", None))
                    if isinstance(t, torch.Tensor)]
            state = getattr(state, "state2", None)
    return out
