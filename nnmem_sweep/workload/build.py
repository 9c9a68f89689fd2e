"""Build what a case describes (model, optimizer, inputs): the workload `measure` records (measure/build.py
measure_case, with fake or real CPU tensors) and the derive package traces at its probe shapes.

A case is a dict: `mode` (train | infer), `batch`, `seq_len` (0 for images), `precision`, `optimizer`,
`optimizer_impl`, `checkpointing`, `attention` (flash = SDPA | eager), `decode_tokens`, optional `dropout_impl`
("native"), `decoder_seq_len` (encoder-decoders), `finetune` (LoRA); and one model source: `hf_config` (a dict),
`model` (a preset id or a hf_configs name), `layers` + `input_shape` + `num_classes`, or `module` ("pkg.mod:factory")
+ `kwargs` + `input_shape`. Anything that traces the same workload (the derive package's probes) does what
measure_case does, step for step:

    cfg, origin = case_config(case)
    with FakeTensorMode():
        with default_dtype(model_dtype(case["precision"])):
            model = build_model(case, cfg)
            opt = build_optimizer(model, case["optimizer"], case["optimizer_impl"]) if train else None
            w = make_workload(case, cfg, model, opt)          # inputs.make_inputs + loss + autocast + kind
        with run_contexts(case, fake=True):
            totals = steps.run_steps(w, recorder)            # recorder: .phase(name, step), .step_done()
"""
from __future__ import annotations

import contextlib
import warnings
from typing import Any, Callable

import torch

from .hf_configs import hf_dict, named_config
from .inputs import input_kind, make_inputs, module_loss
from . import fsdp, preference, qlora
from .steps import Workload, unpacked_sequences

PRECISIONS = ("fp32", "bf16", "fp16", "bf16-mixed", "fp16-mixed")
OPTIMIZERS = ("adamw", "adam", "sgd", "sgd-momentum", "adafactor", "adagrad", "rmsprop")
# model dtype and autocast dtype of each recipe (FORMULAS.md, precision recipes)
_MODEL_DTYPE = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
                "bf16-mixed": torch.float32, "fp16-mixed": torch.float32}
_AUTOCAST_DTYPE = {"bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}
OPTIMIZER_IMPLS = ("foreach", "fused", "forloop")
LR = 1e-4


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    """16-bit models are built by setting the default dtype first, as from_pretrained(dtype=...) does
    (Module.to(dtype) cannot swap FakeTensor parameters)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


@contextlib.contextmanager
def fake_scalars():
    """Adafactor's step reads Python floats (`p.norm(2).item()`), which fake tensors cannot give. The norm is still
    computed (and tracked); only the float it is turned into is made up. Memory-neutral: `.item()` allocates
    nothing, and no shape depends on the value."""
    from torch._subclasses.fake_tensor import FakeTensor

    original = torch.Tensor.item

    def item(self):  # noqa: ANN001, ANN202
        return 1.0 if isinstance(self, FakeTensor) else original(self)

    torch.Tensor.item = item
    try:
        yield
    finally:
        torch.Tensor.item = original


@contextlib.contextmanager
def native_dropout():
    """Dropout as CUDA runs it. On the CPU, F.dropout takes ATen's composite path, `input * bernoulli-mask`, and
    autograd keeps the mask in the input's dtype (4 B per element in fp32); CUDA's fused `native_dropout` keeps a
    1-byte bool mask (aten/src/ATen/native/Dropout.cpp, is_fused_kernel_acceptable). Cases with
    dropout_impl "native" route F.dropout (nn.Dropout and transformers' eager attention) to torch.native_dropout,
    which has a CPU kernel with the same outputs and the same saved tensors."""
    import torch.nn.functional as F

    original = F.dropout

    def dropout(input, p=0.5, training=True, inplace=False):  # noqa: A002, ANN001, ANN202
        if not training or p == 0.0:
            return input
        return torch.native_dropout(input, p, True)[0]

    F.dropout = dropout
    try:
        yield
    finally:
        F.dropout = original


def model_config(case: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The HF config dict a case is built from, and its origin."""
    named = None if "hf_config" in case else named_config(case["model"])
    if "hf_config" in case:
        cfg, origin = dict(case["hf_config"]), "case hf_config"
    elif named is not None:
        cfg, origin = named
    else:
        cfg, origin = hf_dict(case["model"])
    if "head" in case:  # the class named by `architectures` decides the logits (causal LM, masked LM, seq cls)
        cfg["architectures"] = [case["head"]]
    return cfg, origin


def materialise(model: torch.nn.Module) -> torch.nn.Module:
    """Give a model built on the meta device fresh (uninitialised) parameters and buffers on the cpu device, of the
    same shapes and dtypes, tied tensors kept tied; under FakeTensorMode they are fake tensors."""
    new: dict[int, torch.Tensor] = {}
    for mod in model.modules():
        for name, p in list(mod.named_parameters(recurse=False)):
            if id(p) not in new:
                new[id(p)] = torch.nn.Parameter(torch.empty(p.shape, dtype=p.dtype), requires_grad=p.requires_grad)
            setattr(mod, name, new[id(p)])
        for name, b in list(mod.named_buffers(recurse=False)):
            if id(b) not in new:
                new[id(b)] = torch.empty(b.shape, dtype=b.dtype)
            setattr(mod, name, new[id(b)])
    return model


def construct(build: Callable[[], torch.nn.Module]) -> torch.nn.Module:
    """build(), or, where its initialisers read tensor values that fake tensors do not have (torch 2.14's
    trunc_normal_ loops until no sample is out of range: HF ViT, torchvision's ViT), build() on the meta device,
    where initialisers are skipped, then `materialise`d. The values are never read by a fake run; shapes, dtypes
    and ties are what build() gives (tests/measure/test_method.py checks fake against real)."""
    from torch._subclasses.fake_tensor import DataDependentOutputException

    try:
        return build()
    except DataDependentOutputException:
        with torch.device("meta"):
            model = build()
        return materialise(model)


def build_hf_model(cfg: dict[str, Any], attention: str, checkpointing: str, train: bool) -> torch.nn.Module:
    import transformers
    from transformers import AutoConfig

    d = dict(cfg)
    # the dtype comes from the precision recipe (the default dtype set around construction), never from the
    # checkpoint's `torch_dtype` (a bf16 checkpoint trained with bf16-mixed has fp32 parameters)
    d.pop("torch_dtype", None)
    d.pop("dtype", None)
    arch = d.pop("architectures")[0]
    model_type = d.pop("model_type")
    cls = getattr(transformers, arch, None)
    if not (isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel)):
        raise ValueError(f"architectures names {arch!r}, which transformers {transformers.__version__} does not "
                         "provide as a model class (remote code is never run)")
    config = AutoConfig.for_model(model_type, **d)
    config.architectures = [arch]
    # flash = SDPA (the CPU flash-style kernel runs only where dropout is 0); eager = explicit softmax(QK^T)V.
    model = construct(lambda: cls._from_config(config, attn_implementation="sdpa" if attention == "flash" else "eager",
                                               dtype=torch.get_default_dtype()))
    if checkpointing == "full" and train:
        enable_checkpointing(model)
    return model


def enable_checkpointing(model: torch.nn.Module) -> None:
    """Full activation checkpointing, non-reentrant, as the installed transformers spells it:
    activation_checkpointing_enable (5.24) or gradient_checkpointing_enable (the older name: 5.17, the release a
    GPU image may hold, has only this one)."""
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


@contextlib.contextmanager
def replacing_module_to():
    """peft moves and casts each new adapter with Module.to(), which cannot swap FakeTensor parameters
    (MEASURING.md pitfall 3). While peft wraps a fake model, Module.to builds each converted parameter as a new
    Parameter (same requires_grad) and puts it in the module's place instead: the same tensors, dtypes and bytes
    a real conversion leaves behind."""
    original = torch.nn.Module.to

    def convert(t: torch.Tensor, device, dtype) -> torch.Tensor:  # noqa: ANN001
        to_dtype = dtype if (dtype is not None and (t.is_floating_point() or t.is_complex())) else t.dtype
        return t.to(device=device if device is not None else t.device, dtype=to_dtype)

    def to(self, *args, **kwargs):  # noqa: ANN001, ANN202
        device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
        for mod in self.modules():
            for name, p in list(mod._parameters.items()):
                if p is not None:
                    q = convert(p, device, dtype)
                    if q is not p:
                        mod._parameters[name] = torch.nn.Parameter(q, requires_grad=p.requires_grad)
            for name, b in list(mod._buffers.items()):
                if b is not None:
                    mod._buffers[name] = convert(b, device, dtype)
        return self

    torch.nn.Module.to = to
    try:
        yield
    finally:
        torch.nn.Module.to = original


@contextlib.contextmanager
def fake_deepcopy():
    """peft copies each module of modules_to_save with copy.deepcopy, which gives a FakeTensor a fake mode of its
    own (torch then refuses to mix the two). While peft wraps a fake model, a tensor's deepcopy is a clone made
    in the active mode (the same shapes, dtypes and bytes; a Parameter stays a Parameter)."""
    originals = (torch.Tensor.__deepcopy__, torch.nn.Parameter.__deepcopy__)

    def deepcopy(self, memo):  # noqa: ANN001, ANN202
        if id(self) in memo:
            return memo[id(self)]
        new = self.detach().clone()
        if isinstance(self, torch.nn.Parameter):
            new = torch.nn.Parameter(new, requires_grad=self.requires_grad)
        memo[id(self)] = new
        return new

    torch.Tensor.__deepcopy__ = torch.nn.Parameter.__deepcopy__ = deepcopy
    try:
        yield
    finally:
        torch.Tensor.__deepcopy__, torch.nn.Parameter.__deepcopy__ = originals


FINETUNE_MEASURED = ("lora", "qlora")  # qlora: the 4-bit base as bitsandbytes stores and runs it (qlora.py)
ADAPTER_DTYPES = ("fp32", "model")  # peft's autocast_adapter_dtype=True (fp32 adapters) or False (the model's)


def wrap_lora(model: torch.nn.Module, spec: dict[str, Any], fake: bool,
              compute_dtype: torch.dtype | None = None, flat: bool = False) -> torch.nn.Module:
    """The model as peft's get_peft_model(LoraConfig(...)) returns it: base frozen, adapters trainable, the modules
    named in modules_to_save copied and trained whole (peft's ModulesToSaveWrapper). QLoRA: the base's linears in
    NF4 first and the rest in fp32, as BitsAndBytesConfig and prepare_model_for_kbit_training leave it (qlora.py;
    compute_dtype: bnb_4bit_compute_dtype, the recipe's activation dtype); `flat` (sharded by FSDP1, which
    flattens a unit into one float dtype): FSDP-QLoRA's storage in the model's dtype, the rest left in it."""
    from peft import LoraConfig, get_peft_model

    method = spec.get("method", "lora")
    if method not in FINETUNE_MEASURED:
        raise ValueError(f"finetune method {method!r} cannot be measured here; measured: {FINETUNE_MEASURED}")
    if method == "qlora":
        if not qlora.available():
            raise ValueError("finetune method qlora is traced through bitsandbytes' 4-bit storage; install it "
                             "(pip install 'nnmem-sweep[measure]')")
        model = qlora.quantize(model, compute_dtype or torch.get_default_dtype(),
                               next(model.parameters()).dtype if flat else torch.uint8)
    adapter_dtype = spec.get("adapter_dtype", "fp32")
    if adapter_dtype not in ADAPTER_DTYPES:
        raise ValueError(f"adapter_dtype {adapter_dtype!r} not in {ADAPTER_DTYPES}")
    targets = spec.get("targets") or None  # None: peft's default for the model type (q_proj, v_proj for Llama)
    config = LoraConfig(r=int(spec.get("rank", 8)), lora_alpha=int(spec.get("alpha", 8)),
                        lora_dropout=float(spec.get("dropout", 0.0)),
                        target_modules=None if targets is None else
                        ("all-linear" if list(targets) == ["all-linear"] else list(targets)),
                        modules_to_save=list(spec["modules_to_save"]) if spec.get("modules_to_save") else None,
                        task_type="CAUSAL_LM" if type(model).__name__.endswith("ForCausalLM") else None)
    with (replacing_module_to() if fake else contextlib.nullcontext()), \
            (fake_deepcopy() if fake else contextlib.nullcontext()), warnings.catch_warnings():
        # peft asks the model is_gradient_checkpointing, which transformers >= 5.24 deprecates with a FutureWarning
        # a user can do nothing about
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        return get_peft_model(model, config, autocast_adapter_dtype=adapter_dtype == "fp32")


def build_layer_model(layers: list[dict[str, Any]], input_shape: tuple[int, ...]) -> torch.nn.Module:
    """A CNN/MLP from a layer list, through the models package's builder (the estimator reads the same list)."""
    from nnmem_sweep.models.torch_layers import torch_module_from_layers

    return torch_module_from_layers(list(input_shape), layers)


def build_optimizer(model: torch.nn.Module, name: str, impl: str) -> Any:
    """The optimizer over the trainable parameters (a sharded model's: over its local shards, fsdp.py)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if fsdp.is_sharded(model):
        shards = [fsdp.local(p).detach() for p in params]
        return fsdp.LocalShardOptimizer(_optimizer(shards, name, impl), params, shards)
    return _optimizer(params, name, impl)


def _optimizer(params: list, name: str, impl: str) -> torch.optim.Optimizer:
    kw: dict[str, Any] = {}
    if impl == "foreach":
        kw["foreach"] = True  # the CUDA default; MEASURING.md pitfall 7
    elif impl == "fused":
        kw["fused"] = True
    else:
        kw["foreach"] = False
    if name == "adamw":
        return torch.optim.AdamW(params, lr=LR, **kw)
    if name == "adam":
        return torch.optim.Adam(params, lr=LR, **kw)
    if name in ("sgd", "sgd-momentum"):
        return torch.optim.SGD(params, lr=LR, momentum=0.9 if name == "sgd-momentum" else 0.0, **kw)
    if name == "adafactor":
        kw.pop("fused", None)
        return torch.optim.Adafactor(params, lr=LR, **kw)
    if name == "adagrad":
        return torch.optim.Adagrad(params, lr=LR, **kw)
    if name == "rmsprop":
        kw.pop("fused", None)
        return torch.optim.RMSprop(params, lr=LR, **kw)
    raise ValueError(f"optimizer {name!r} not in {OPTIMIZERS}")


def build_module_model(case: dict[str, Any]) -> torch.nn.Module:
    """A `module:` model: `case["module"]` names an importable torch.nn.Module factory as "package.module:attr"
    (e.g. "torchvision.models:resnet50"), called with `case["kwargs"]`. Random init: a `weights` argument other than
    None is refused (nothing is ever downloaded)."""
    import importlib

    spec = str(case["module"])
    mod_name, sep, attr = spec.partition(":")
    if not sep or not mod_name or not attr:
        raise ValueError(f"module {spec!r}: give 'package.module:factory', e.g. 'torchvision.models:resnet50'")
    kwargs = dict(case.get("kwargs") or {})
    for key in ("weights", "pretrained"):
        if kwargs.get(key) not in (None, False):
            raise ValueError(f"module {spec!r}: kwargs.{key} would load published weights; models are measured "
                             "from random init (leave it out)")
    factory: Any = importlib.import_module(mod_name)
    for part in attr.split("."):
        factory = getattr(factory, part)
    model = construct(lambda: factory(**kwargs))
    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"module {spec!r} returned {type(model).__name__}, not a torch.nn.Module")
    return model


def build_model(case: dict[str, Any], cfg: dict[str, Any], fake: bool = True) -> torch.nn.Module:
    """The case's model, built in the current default dtype (call inside `default_dtype(...)` and, when measuring
    fake, inside the FakeTensorMode): a layer list, a `module:` factory, or the HF class named in `architectures`
    (LoRA-wrapped when the case has `finetune`)."""
    if "layers" in case:
        return build_layer_model(case["layers"], tuple(case["input_shape"]))
    if "module" in case:
        if case.get("checkpointing", "none") != "none":
            raise ValueError(f"module {case['module']!r}: checkpointing needs the model's own support; "
                             "only 'none' is measured for `module:` models")
        return build_module_model(case)
    model = build_hf_model(cfg, case.get("attention", "flash"), case.get("checkpointing", "none"),
                           case["mode"] == "train")
    if "finetune" in case:
        model = wrap_lora(model, case["finetune"], fake, compute_dtype(case.get("precision", "fp32")),
                          flat=fsdp.version(case.get("fsdp")) == 1)
    if case.get("fsdp"):  # one rank of an FSDP2-sharded step (inside fsdp.fake_process_group: sharding())
        model = fsdp.shard(model, case["fsdp"])
    return model


@contextlib.contextmanager
def sharding(case: dict[str, Any]):
    """The fake process group a sharded case (case["fsdp"]) is built and run in, with the host's stand-ins where it
    offloads to the CPU (fsdp.host_stand_ins); nothing for the others."""
    if not case.get("fsdp"):
        yield
        return
    with fsdp.fake_process_group(fsdp.check(case["fsdp"])[0]), \
            (fsdp.host_stand_ins() if fsdp.offloaded(case["fsdp"]) else contextlib.nullcontext()):
        yield


def make_workload(case: dict[str, Any], cfg: dict[str, Any], model: torch.nn.Module,
                  optimizer: torch.optim.Optimizer | None) -> Workload:
    """The Workload `run_steps` runs for a case: its inputs (inputs.make_inputs), the loss of a plain module, the
    autocast dtype of its recipe and its decode steps; a preference step's pairs, loss and reference model
    (workload/preference.py). Call it where the model was built."""
    if case.get("preference") and case["mode"] == "train":
        spec = case["preference"]
        reference = None
        if spec["loss"] == "dpo" and spec.get("reference", "model") == "model":  # a frozen copy of the model
            reference = build_hf_model(cfg, case.get("attention", "flash"), "none", train=False)
            reference.requires_grad_(False)
            reference.eval()
        return Workload(model=model, inputs=preference.make_inputs(case, model), mode="train", optimizer=optimizer,
                        autocast_dtype=_AUTOCAST_DTYPE.get(case.get("precision", "fp32")),
                        loss_fn=preference.loss_fn(spec, reference), kind="preference",
                        zero_grad=case.get("zero_grad", "set_to_none"),
                        accum=int(case.get("gradient_accumulation", 1)), reference=reference)
    return Workload(model=model, inputs=make_inputs(case, cfg, model), mode=case["mode"], optimizer=optimizer,
                    autocast_dtype=_AUTOCAST_DTYPE.get(case.get("precision", "fp32")),
                    decode_tokens=int(case.get("decode_tokens", 0) or 0),
                    loss_fn=module_loss if ("layers" in case or "module" in case) else None,
                    kind=input_kind(case, model), zero_grad=case.get("zero_grad", "set_to_none"),
                    accum=int(case.get("gradient_accumulation", 1)), grad_sync=case.get("gradient_sync", "each"))


def case_config(case: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """model_config for HF cases; for a layer list or a `module:` factory, no HF config and its origin."""
    if "layers" in case:
        return {}, "layers"
    if "module" in case:
        return {}, f"module {case['module']}"
    return model_config(case)


def compute_dtype(precision: str) -> torch.dtype:
    """The dtype a recipe computes in: the autocast dtype of a mixed recipe, else the model's."""
    return _AUTOCAST_DTYPE.get(precision) or model_dtype(precision)


def model_dtype(precision: str) -> torch.dtype:
    """The dtype a recipe builds its model in (fp32 parameters for the mixed recipes)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r} not in {PRECISIONS}")
    return _MODEL_DTYPE[precision]


@contextlib.contextmanager
def run_contexts(case: dict[str, Any], fake: bool = True):
    """What every run of a case's workload happens inside: transformers' packed-sequence check answered as for
    unpacked inputs (MEASURING.md pitfall 1), F.dropout as CUDA's native_dropout where the case says so, and under
    fake tensors the made-up Python floats of `.item()` (Adafactor). Enter it around tracker.run_steps."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(unpacked_sequences())
        if fake:
            stack.enter_context(fake_scalars())
        if case.get("dropout_impl") == "native":
            stack.enter_context(native_dropout())
        yield
