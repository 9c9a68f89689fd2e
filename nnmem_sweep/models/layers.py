"""CNN / MLP nets given as a layer list: shape inference and exact per-layer parameter and output counts.

Shapes are per sample (no batch dimension), as in PyTorch with the batch dimension dropped: conv and 2-D pooling
take (C, H, W), linear acts on the last dimension, flatten turns everything into one vector. Output sizes follow the
formulas in the PyTorch documentation of each layer (torch.nn.Conv2d, MaxPool2d, AvgPool2d, AdaptiveAvgPool2d).
"""
from __future__ import annotations

import math
from typing import Any, Callable

from ..citations import formula, source
from ._errors import FieldError
from .arch import Architecture, LayerRecord

TORCH_NN_DOCS = source("torch-nn-docs", "PyTorch documentation, torch.nn layer reference (Conv2d, Linear, "
                                        "MaxPool2d, AvgPool2d, BatchNorm2d, LayerNorm)",
                       "https://pytorch.org/docs/stable/nn.html")

Shape = tuple[int, ...]


def _int(where: str, key: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise FieldError(f"{where}.{key}", f"must be an integer >= {minimum}, got {value!r}")
    return value


def _pair(where: str, key: str, value: Any, minimum: int) -> tuple[int, int]:
    if isinstance(value, (list, tuple)):
        if len(value) != 2:
            raise FieldError(f"{where}.{key}", f"must be an integer or a pair [h, w], got {value!r}")
        return _int(where, key, value[0], minimum), _int(where, key, value[1], minimum)
    v = _int(where, key, value, minimum)
    return v, v


def _flag(where: str, key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise FieldError(f"{where}.{key}", f"must be true or false, got {value!r}")
    return value


def _need(where: str, shape: Shape, dims: int | tuple[int, ...], what: str) -> None:
    allowed = (dims,) if isinstance(dims, int) else dims
    if len(shape) not in allowed:
        raise FieldError(f"{where}.type", f"{what} needs a {' or '.join(f'{d}-D' for d in allowed)} input per "
                                          f"sample, got shape {list(shape)}")


def _channels(where: str, spec: dict, key: str, have: int) -> int:
    """in_channels / in_features / num_features: inferred from the previous shape, checked when given."""
    if key not in spec:
        return have
    given = _int(where, key, spec[key])
    if given != have:
        raise FieldError(f"{where}.{key}", f"is {given} but the previous layer gives {have}")
    return given


@formula("conv_output_size", "H_out = ⌊(H + 2·p − d·(k − 1) − 1) / s⌋ + 1", TORCH_NN_DOCS,
         where="torch.nn.Conv2d / MaxPool2d / AvgPool2d, 'Shape' section (ceil_mode=False)")
def _out_size(where: str, size: int, k: int, s: int, p: int, d: int) -> int:
    out = (size + 2 * p - d * (k - 1) - 1) // s + 1
    if out <= 0:
        raise FieldError(f"{where}.kernel_size", f"kernel {k} (dilation {d}, padding {p}) does not fit an input "
                                                 f"of size {size}")
    return out


# Each builder returns (normalised spec with every argument explicit, output shape, params, weight elements).
Built = tuple[dict[str, Any], Shape, int, int]


@formula("conv2d_params", "C_out · (C_in / groups) · k_h · k_w + C_out (bias)", TORCH_NN_DOCS,
         where="torch.nn.Conv2d, 'Variables'")
def _conv2d(where: str, spec: dict, shape: Shape) -> Built:
    _need(where, shape, 3, "conv2d")
    c, h, w = shape
    c_in = _channels(where, spec, "in_channels", c)
    if "out_channels" not in spec:
        raise FieldError(f"{where}.out_channels", "missing required field")
    c_out = _int(where, "out_channels", spec["out_channels"])
    if "kernel_size" not in spec:
        raise FieldError(f"{where}.kernel_size", "missing required field")
    kh, kw = _pair(where, "kernel_size", spec["kernel_size"], 1)
    sh, sw = _pair(where, "stride", spec.get("stride", 1), 1)
    dh, dw = _pair(where, "dilation", spec.get("dilation", 1), 1)
    padding = spec.get("padding", 0)
    if padding == "valid":
        ph = pw = 0
    elif padding == "same":
        if (sh, sw) != (1, 1):
            raise FieldError(f"{where}.padding", "'same' needs stride 1 (as in PyTorch)")
        if (dh * (kh - 1)) % 2 or (dw * (kw - 1)) % 2:
            raise FieldError(f"{where}.padding", "'same' with an even kernel pads unevenly; give padding as numbers")
        ph, pw = dh * (kh - 1) // 2, dw * (kw - 1) // 2
    else:
        ph, pw = _pair(where, "padding", padding, 0)
    groups = _int(where, "groups", spec.get("groups", 1))
    if c_in % groups or c_out % groups:
        raise FieldError(f"{where}.groups", f"must divide in_channels ({c_in}) and out_channels ({c_out})")
    bias = _flag(where, "bias", spec.get("bias", True))
    out = (c_out, _out_size(where, h, kh, sh, ph, dh), _out_size(where, w, kw, sw, pw, dw))
    weight = c_out * (c_in // groups) * kh * kw
    norm = dict(in_channels=c_in, out_channels=c_out, kernel_size=(kh, kw), stride=(sh, sw), padding=(ph, pw),
                dilation=(dh, dw), groups=groups, bias=bias)
    return norm, out, weight + (c_out if bias else 0), weight


@formula("linear_params", "in · out + out (bias)", TORCH_NN_DOCS, where="torch.nn.Linear, 'Variables'")
def _linear(where: str, spec: dict, shape: Shape) -> Built:
    if not shape:
        raise FieldError(f"{where}.type", "linear needs at least a 1-D input")
    n_in = _channels(where, spec, "in_features", shape[-1])
    if "out_features" not in spec:
        raise FieldError(f"{where}.out_features", "missing required field")
    n_out = _int(where, "out_features", spec["out_features"])
    bias = _flag(where, "bias", spec.get("bias", True))
    return (dict(in_features=n_in, out_features=n_out, bias=bias), shape[:-1] + (n_out,),
            n_in * n_out + (n_out if bias else 0), n_in * n_out)


def _batchnorm(dims: tuple[int, ...], what: str) -> Callable[[str, dict, Shape], Built]:
    def build(where: str, spec: dict, shape: Shape) -> Built:
        _need(where, shape, dims, what)
        c = _channels(where, spec, "num_features", shape[0])
        affine = _flag(where, "affine", spec.get("affine", True))
        # weight (γ) and bias (β) of C each; running mean/var are buffers, not parameters
        return dict(num_features=c, affine=affine), shape, 2 * c if affine else 0, 0

    return build


def _layernorm(where: str, spec: dict, shape: Shape) -> Built:
    normalized = spec.get("normalized_shape", [shape[-1]] if shape else [])
    if isinstance(normalized, int) and not isinstance(normalized, bool):
        normalized = [normalized]
    if not isinstance(normalized, list) or not normalized:
        raise FieldError(f"{where}.normalized_shape", f"must be an integer or a list, got {normalized!r}")
    dims = tuple(_int(where, "normalized_shape", v) for v in normalized)
    if shape[len(shape) - len(dims):] != dims or len(dims) > len(shape):
        raise FieldError(f"{where}.normalized_shape", f"{list(dims)} does not end the input shape {list(shape)}")
    affine = _flag(where, "elementwise_affine", spec.get("elementwise_affine", True))
    bias = _flag(where, "bias", spec.get("bias", True))
    n = math.prod(dims)
    params = (n + (n if bias else 0)) if affine else 0
    return dict(normalized_shape=dims, elementwise_affine=affine, bias=bias), shape, params, 0


def _pool(kind: str) -> Callable[[str, dict, Shape], Built]:
    def build(where: str, spec: dict, shape: Shape) -> Built:
        _need(where, shape, 3, kind)
        c, h, w = shape
        if "kernel_size" not in spec:
            raise FieldError(f"{where}.kernel_size", "missing required field")
        kh, kw = _pair(where, "kernel_size", spec["kernel_size"], 1)
        stride = spec.get("stride")
        sh, sw = (kh, kw) if stride is None else _pair(where, "stride", stride, 1)  # PyTorch: stride = kernel
        ph, pw = _pair(where, "padding", spec.get("padding", 0), 0)
        if ph > kh // 2 or pw > kw // 2:
            raise FieldError(f"{where}.padding", "must be at most half the kernel size (as in PyTorch)")
        dh, dw = (1, 1)
        norm = dict(kernel_size=(kh, kw), stride=(sh, sw), padding=(ph, pw))
        if kind == "maxpool2d":
            dh, dw = _pair(where, "dilation", spec.get("dilation", 1), 1)
            norm["dilation"] = (dh, dw)
        out = (c, _out_size(where, h, kh, sh, ph, dh), _out_size(where, w, kw, sw, pw, dw))
        return norm, out, 0, 0

    return build


def _adaptive_pool(where: str, spec: dict, shape: Shape) -> Built:
    _need(where, shape, 3, "adaptiveavgpool2d")
    if "output_size" not in spec:
        raise FieldError(f"{where}.output_size", "missing required field")
    oh, ow = _pair(where, "output_size", spec["output_size"], 1)
    return dict(output_size=(oh, ow)), (shape[0], oh, ow), 0, 0


def _flatten(where: str, spec: dict, shape: Shape) -> Built:
    # nn.Flatten() (start_dim=1 with the batch dimension): every per-sample dimension into one
    return {}, (math.prod(shape),), 0, 0


def _dropout(where: str, spec: dict, shape: Shape) -> Built:
    p = spec.get("p", 0.5)
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p < 1:
        raise FieldError(f"{where}.p", f"must be a probability in [0, 1), got {p!r}")
    return dict(p=float(p)), shape, 0, 0


def _elementwise(where: str, spec: dict, shape: Shape) -> Built:
    return {}, shape, 0, 0


BUILDERS: dict[str, Callable[[str, dict, Shape], Built]] = {
    "conv2d": _conv2d,
    "linear": _linear,
    "batchnorm2d": _batchnorm((3,), "batchnorm2d"),
    "batchnorm1d": _batchnorm((1, 2), "batchnorm1d"),
    "layernorm": _layernorm,
    "relu": _elementwise,
    "gelu": _elementwise,
    "silu": _elementwise,
    "tanh": _elementwise,
    "sigmoid": _elementwise,
    "maxpool2d": _pool("maxpool2d"),
    "avgpool2d": _pool("avgpool2d"),
    "adaptiveavgpool2d": _adaptive_pool,
    "flatten": _flatten,
    "dropout": _dropout,
}

# Keys each type accepts besides `type` and `name`.
ALLOWED_KEYS: dict[str, tuple[str, ...]] = {
    "conv2d": ("in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation", "groups", "bias"),
    "linear": ("in_features", "out_features", "bias"),
    "batchnorm2d": ("num_features", "affine"),
    "batchnorm1d": ("num_features", "affine"),
    "layernorm": ("normalized_shape", "elementwise_affine", "bias"),
    "maxpool2d": ("kernel_size", "stride", "padding", "dilation"),
    "avgpool2d": ("kernel_size", "stride", "padding"),
    "adaptiveavgpool2d": ("output_size",),
    "dropout": ("p",),
}


def resolve_layers(input_shape: Any, layers: Any) -> list[tuple[str, dict[str, Any], LayerRecord]]:
    """(type, every argument explicit, record) per layer, after shape inference; FieldError on bad input."""
    if not isinstance(input_shape, (list, tuple)) or not input_shape:
        raise FieldError("input_shape", f"must be a non-empty list of sizes per sample, got {input_shape!r}")
    for i, v in enumerate(input_shape):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise FieldError(f"input_shape[{i}]", f"must be a positive integer, got {v!r}")
    shape: Shape = tuple(input_shape)
    if not isinstance(layers, list) or not layers:
        raise FieldError("layers", "must be a non-empty list of layers")
    out: list[tuple[str, dict[str, Any], LayerRecord]] = []
    counts: dict[str, int] = {}
    seen: set[str] = set()
    for index, spec in enumerate(layers):
        where = f"layers[{index}]"
        if not isinstance(spec, dict):
            raise FieldError(where, f"must be a mapping with a 'type', got {spec!r}")
        kind = spec.get("type")
        if kind not in BUILDERS:
            raise FieldError(f"{where}.type", f"unknown layer type {kind!r}; known: {', '.join(BUILDERS)}")
        for key in spec:
            if key not in ("type", "name", *ALLOWED_KEYS.get(kind, ())):
                raise FieldError(f"{where}.{key}", f"not a {kind} argument; {kind} takes "
                                                   f"{', '.join(ALLOWED_KEYS.get(kind, ())) or 'no arguments'}")
        norm, shape, params, weight = BUILDERS[kind](where, spec, shape)
        counts[kind] = counts.get(kind, 0) + 1
        name = spec.get("name") or f"{kind}_{counts[kind]}"
        if not isinstance(name, str) or name in seen:
            raise FieldError(f"{where}.name", f"must be a unique string, got {name!r}")
        seen.add(name)
        out.append((kind, norm, LayerRecord(name=name, type=kind, output_shape=shape, params=params,
                                            output_elements=math.prod(shape), weight_params=weight)))
    return out


def architecture_from_layers(input_shape: Any, layers: Any, origin: str = "layer list") -> Architecture:
    rows = tuple(record for _, _, record in resolve_layers(input_shape, layers))
    return Architecture(
        name=f"{len(rows)}-layer net", kind="layers", family="layers", params=sum(r.params for r in rows),
        largest_layer_params=max(r.params for r in rows), input_shape=tuple(input_shape), layer_table=rows,
        origin=origin,
    )
