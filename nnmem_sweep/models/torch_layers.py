"""The torch.nn.Sequential a layer list describes (torch is imported only when this is called)."""
from __future__ import annotations

from typing import Any

from .layers import resolve_layers


def torch_module_from_layers(input_shape: Any, layers: Any):
    """nn.Sequential with one module per layer, named as in the layer table; arguments as shape inference
    resolved them (in_channels / in_features filled in). Raises the same FieldError as the estimator for bad input."""
    from collections import OrderedDict

    from torch import nn

    make = {
        "conv2d": lambda a: nn.Conv2d(**a),
        "linear": lambda a: nn.Linear(**a),
        "batchnorm2d": lambda a: nn.BatchNorm2d(**a),
        "batchnorm1d": lambda a: nn.BatchNorm1d(**a),
        "layernorm": lambda a: nn.LayerNorm(list(a["normalized_shape"]), elementwise_affine=a["elementwise_affine"],
                                            bias=a["bias"]),
        "relu": lambda a: nn.ReLU(),
        "gelu": lambda a: nn.GELU(),
        "silu": lambda a: nn.SiLU(),
        "tanh": lambda a: nn.Tanh(),
        "sigmoid": lambda a: nn.Sigmoid(),
        "maxpool2d": lambda a: nn.MaxPool2d(**a),
        "avgpool2d": lambda a: nn.AvgPool2d(**a),
        "adaptiveavgpool2d": lambda a: nn.AdaptiveAvgPool2d(a["output_size"]),
        "flatten": lambda a: nn.Flatten(),
        "dropout": lambda a: nn.Dropout(**a),
    }
    modules = OrderedDict(
        (record.name.replace(".", "_"), make[kind](args)) for kind, args, record in resolve_layers(input_shape, layers)
    )
    return nn.Sequential(modules)
