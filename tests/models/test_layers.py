"""Layer-list nets: hand-computed counts and shapes, the same list built with torch.nn, and located errors."""
from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from nnmem_sweep.models._errors import FieldError
from nnmem_sweep.models.count import params_breakdown
from nnmem_sweep.models.layers import architecture_from_layers

LENET5 = [
    dict(type="conv2d", out_channels=6, kernel_size=5),
    dict(type="relu"),
    dict(type="maxpool2d", kernel_size=2),
    dict(type="conv2d", out_channels=16, kernel_size=5),
    dict(type="relu"),
    dict(type="maxpool2d", kernel_size=2),
    dict(type="flatten"),
    dict(type="linear", out_features=120),
    dict(type="relu"),
    dict(type="linear", out_features=84),
    dict(type="relu"),
    dict(type="linear", out_features=10),
]

VGGISH = [
    dict(type="conv2d", out_channels=16, kernel_size=3, padding=1, bias=False),
    dict(type="batchnorm2d"),
    dict(type="relu", name="act"),
    dict(type="conv2d", in_channels=16, out_channels=32, kernel_size=3, stride=2, padding=1),
    dict(type="conv2d", out_channels=32, kernel_size=3, padding="same", dilation=2, groups=4),
    dict(type="maxpool2d", kernel_size=3, stride=2, padding=1),
    dict(type="avgpool2d", kernel_size=2),
    dict(type="adaptiveavgpool2d", output_size=2),
    dict(type="flatten"),
    dict(type="dropout", p=0.3),
    dict(type="linear", out_features=64),
    dict(type="layernorm"),
    dict(type="gelu"),
    dict(type="batchnorm1d"),
    dict(type="tanh"),
    dict(type="linear", out_features=10, bias=False),
    dict(type="sigmoid"),
    dict(type="silu"),
]


def test_lenet5_by_hand():
    a = architecture_from_layers([1, 32, 32], LENET5)
    rows = a.layer_table
    # conv 1->6, 5x5: 6*1*25 + 6 = 156; 32 - 5 + 1 = 28
    assert (rows[0].params, rows[0].output_shape, rows[0].output_elements) == (156, (6, 28, 28), 4704)
    assert rows[2].output_shape == (6, 14, 14)  # 2x2 pool, stride defaults to the kernel
    # conv 6->16, 5x5: 16*6*25 + 16 = 2416; 14 - 5 + 1 = 10
    assert (rows[3].params, rows[3].output_shape) == (2416, (16, 10, 10))
    assert rows[6].output_shape == (400,)  # 16*5*5
    # linear 400->120: 48,120; 120->84: 10,164; 84->10: 850
    assert [r.params for r in rows[7::2]] == [48_120, 10_164, 850]
    assert a.params == 156 + 2416 + 48_120 + 10_164 + 850 == 61_706
    # conv, relu 4704 each; pool 1176; conv, relu 1600 each; pool, flatten 400 each; linear+relu pairs; logits
    assert sum(r.output_elements for r in rows) == 4704 * 2 + 1176 + 1600 * 2 + 400 * 2 + 120 * 2 + 84 * 2 + 10
    b = params_breakdown(a)
    assert b["linear_weight_in_layers"] == 150 + 2400 + 48_000 + 10_080 + 840  # weights without biases
    assert b["largest_tensor"] == 48_000 and b["largest_layer_params"] == 48_120
    assert [r.name for r in rows[:3]] == ["conv2d_1", "relu_1", "maxpool2d_1"]


def test_vggish_by_hand():
    a = architecture_from_layers([3, 32, 32], VGGISH)
    shapes = [r.output_shape for r in a.layer_table]
    # conv pad 1 keeps 32; stride 2: (32 + 2 - 2 - 1) // 2 + 1 = 16; 'same' keeps 16;
    # maxpool k3 s2 p1: (16 + 2 - 2 - 1) // 2 + 1 = 8; avgpool 2: 4; adaptive: 2; flatten 32*2*2 = 128
    assert shapes[:9] == [(16, 32, 32)] * 3 + [(32, 16, 16)] * 2 + [(32, 8, 8), (32, 4, 4), (32, 2, 2), (128,)]
    # 16*3*9 (no bias) + BN 2*16 + (32*16*9 + 32) + (32*8*9 + 32) + (128*64 + 64) + LN 2*64 + BN1d 2*64 + 64*10
    assert a.params == 432 + 32 + 4640 + 2336 + 8256 + 128 + 128 + 640 == 16_592
    assert a.layer_table[2].name == "act"


@pytest.mark.parametrize("layers, input_shape", [(LENET5, [1, 32, 32]), (VGGISH, [3, 32, 32])],
                         ids=["lenet5", "vggish"])
def test_matches_torch(layers, input_shape):
    torch = pytest.importorskip("torch", reason="torch builds the reference module")
    from nnmem_sweep.models.torch_layers import torch_module_from_layers

    a = architecture_from_layers(input_shape, layers)
    with torch.device("meta"):
        net = torch_module_from_layers(input_shape, layers).eval()
        x = torch.empty(2, *input_shape)
    assert sum(p.numel() for p in net.parameters()) == a.params
    for module, record in zip(net, a.layer_table, strict=True):
        x = module(x)
        assert tuple(x.shape) == (2, *record.output_shape), record.name
        assert sum(p.numel() for p in module.parameters()) == record.params, record.name


@pytest.mark.parametrize("layers, input_shape, key, message", [
    ([dict(type="conv3d")], [3, 8, 8], "layers[0].type", "unknown layer type 'conv3d'"),
    ([dict(type="flatten"), dict(type="conv2d", out_channels=4, kernel_size=3)], [3, 8, 8], "layers[1].type",
     "conv2d needs a 3-D input"),
    ([dict(type="conv2d", in_channels=4, out_channels=4, kernel_size=3)], [3, 8, 8], "layers[0].in_channels",
     "is 4 but the previous layer gives 3"),
    ([dict(type="relu"), dict(type="conv2d", out_channels=4, kernel_size=-3)], [3, 8, 8],
     "layers[1].kernel_size", ">= 1"),
    ([dict(type="conv2d", out_channels=4, kernel_size=9)], [3, 8, 8], "layers[0].kernel_size", "does not fit"),
    ([dict(type="conv2d", out_channels=4)], [3, 8, 8], "layers[0].kernel_size", "missing"),
    ([dict(type="conv2d", out_channels=4, kernel_size=3, groups=2)], [3, 8, 8], "layers[0].groups", "divide"),
    ([dict(type="linear", out_features=4, kernel_size=3)], [8], "layers[0].kernel_size", "not a linear argument"),
    ([dict(type="linear", in_features=9, out_features=4)], [8], "layers[0].in_features", "previous layer gives 8"),
    ([dict(type="dropout", p=1.0)], [8], "layers[0].p", "probability"),
    ([dict(type="relu", name="a"), dict(type="relu", name="a")], [8], "layers[1].name", "unique"),
    ([dict(type="layernorm", normalized_shape=[5])], [8], "layers[0].normalized_shape", "does not end"),
    ([dict(type="relu")], [3, -1], "input_shape[1]", "positive integer"),
    ([], [3], "layers", "non-empty"),
    (["relu"], [3], "layers[0]", "mapping"),
])
def test_errors_name_layer_and_key(layers, input_shape, key, message):
    with pytest.raises(FieldError, match=message) as e:
        architecture_from_layers(input_shape, layers)
    assert e.value.key == key


# Random conv / pool stacks: wherever shape inference accepts a net, torch agrees on every output shape and
# parameter count; wherever it refuses one for its sizes, torch refuses it too.
_conv = st.fixed_dictionaries(
    {"type": st.just("conv2d"), "out_channels": st.sampled_from([2, 4, 6]), "kernel_size": st.integers(1, 5),
     "stride": st.integers(1, 3), "padding": st.integers(0, 2), "dilation": st.integers(1, 2),
     "groups": st.sampled_from([1, 2]), "bias": st.booleans()})
_pool = st.fixed_dictionaries(
    {"type": st.sampled_from(["maxpool2d", "avgpool2d"]), "kernel_size": st.integers(1, 4),
     "stride": st.integers(1, 3), "padding": st.integers(0, 2)})


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(_conv, _pool), min_size=1, max_size=4), st.integers(4, 20))
def test_random_conv_pool_stacks_agree_with_torch(layers, size):
    torch = pytest.importorskip("torch", reason="torch builds the reference module")
    from torch import nn

    input_shape = [2, size, size]
    try:
        a = architecture_from_layers(input_shape, layers)
    except FieldError as e:
        index = int(e.key.split("[")[1].split("]")[0])
        assume(e.key.endswith((".kernel_size", ".padding")))  # groups / channel errors are ours alone
        x, c = torch.empty(1, *input_shape, device="meta"), input_shape[0]
        with pytest.raises((RuntimeError, ValueError)):
            for spec in layers[: index + 1]:
                args = {k: v for k, v in spec.items() if k != "type"}
                if spec["type"] == "conv2d":
                    module = nn.Conv2d(c, **args, device="meta")
                    c = spec["out_channels"]
                else:
                    module = (nn.MaxPool2d if spec["type"] == "maxpool2d" else nn.AvgPool2d)(**args)
                x = module(x)
        return
    from nnmem_sweep.models.torch_layers import torch_module_from_layers

    with torch.device("meta"):
        net = torch_module_from_layers(input_shape, layers)
        x = torch.empty(1, *input_shape)
    for module, record in zip(net, a.layer_table, strict=True):
        x = module(x)
        assert tuple(x.shape[1:]) == record.output_shape
        assert sum(p.numel() for p in module.parameters()) == record.params


def _conv_relu(out, k=3, **kw):
    return [dict(type="conv2d", out_channels=out, kernel_size=k, **kw), dict(type="relu")]


_POOL = dict(type="maxpool2d", kernel_size=2)
VGG11 = [  # torchvision vgg11 (config "A"), no batch norm
    *_conv_relu(64, padding=1), _POOL, *_conv_relu(128, padding=1), _POOL,
    *_conv_relu(256, padding=1), *_conv_relu(256, padding=1), _POOL,
    *_conv_relu(512, padding=1), *_conv_relu(512, padding=1), _POOL,
    *_conv_relu(512, padding=1), *_conv_relu(512, padding=1), _POOL,
    dict(type="adaptiveavgpool2d", output_size=7), dict(type="flatten"),
    dict(type="linear", out_features=4096), dict(type="relu"), dict(type="dropout"),
    dict(type="linear", out_features=4096), dict(type="relu"), dict(type="dropout"),
    dict(type="linear", out_features=1000),
]
ALEXNET = [  # torchvision alexnet
    *_conv_relu(64, k=11, stride=4, padding=2), dict(type="maxpool2d", kernel_size=3, stride=2),
    *_conv_relu(192, k=5, padding=2), dict(type="maxpool2d", kernel_size=3, stride=2),
    *_conv_relu(384, padding=1), *_conv_relu(256, padding=1), *_conv_relu(256, padding=1),
    dict(type="maxpool2d", kernel_size=3, stride=2), dict(type="adaptiveavgpool2d", output_size=6),
    dict(type="flatten"), dict(type="dropout"), dict(type="linear", out_features=4096), dict(type="relu"),
    dict(type="dropout"), dict(type="linear", out_features=4096), dict(type="relu"),
    dict(type="linear", out_features=1000),
]


@pytest.mark.parametrize("layers, published", [
    pytest.param(VGG11, 132_863_336, id="vgg11-torchvision-VGG11_Weights.IMAGENET1K_V1-num_params"),
    pytest.param(ALEXNET, 61_100_840, id="alexnet-torchvision-AlexNet_Weights.IMAGENET1K_V1-num_params"),
])
def test_published_imagenet_nets(layers, published):
    a = architecture_from_layers([3, 224, 224], layers)
    assert a.params == published
    assert a.layer_table[-1].output_shape == (1000,)
