import pytest
import torch
from torch import nn

from specasr.targets.packed import PackedLinears, packable

needs_onednn = pytest.mark.skipif(not packable(torch.zeros(1)), reason="packing needs an x86 CPU and oneDNN in torch")


def _layer(inputs: int, outputs: int, bias: bool = True) -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(inputs, outputs, bias=bias).eval().requires_grad_(False)


@needs_onednn
@pytest.mark.parametrize(("shape", "bias"), [((1, 1, 64), True), ((1, 5, 64), False), ((2, 300, 64), True)])
def test_a_packed_layer_computes_the_layer(shape, bias):
    layer, linears = _layer(64, 96, bias), PackedLinears()
    x = torch.randn(*shape)
    assert torch.allclose(linears(layer, x), layer(x), atol=1e-5, rtol=1e-5)


@needs_onednn
def test_a_row_is_the_same_alone_and_in_a_block():
    layer, linears = _layer(384, 1536), PackedLinears()
    block = torch.randn(1, 5, 384)
    alone = torch.cat([linears(layer, block[:, i : i + 1]) for i in range(5)], dim=1)
    assert torch.equal(alone, linears(layer, block))


@needs_onednn
def test_a_changed_weight_is_packed_again():
    layer, linears = _layer(16, 8), PackedLinears()
    x = torch.randn(3, 16)
    linears(layer, x)
    layer.weight.mul_(-2)
    assert torch.allclose(linears(layer, x), layer(x), atol=1e-5)
    layer.weight.data = torch.randn(8, 16)
    assert torch.allclose(linears(layer, x), layer(x), atol=1e-5)


@needs_onednn
def test_a_layer_made_under_inference_mode_is_packed():
    with torch.inference_mode():
        layer, x = nn.Linear(16, 8), torch.randn(3, 16)
        assert torch.allclose(PackedLinears()(layer, x), layer(x), atol=1e-5)


def test_gradients_flow_where_autograd_records():
    layer, linears = nn.Linear(16, 8), PackedLinears()
    x = torch.randn(3, 16, requires_grad=True)
    linears(layer, x).sum().backward()
    assert layer.weight.grad is not None and x.grad is not None


def test_layers_it_cannot_pack_run_as_they_are():
    half, double = _layer(8, 4).half(), _layer(8, 4).double()
    assert not packable(half.weight) and not packable(double.weight)
    linears = PackedLinears()
    for layer in (half, double):
        x = torch.randn(3, 8, dtype=layer.weight.dtype)
        assert torch.equal(linears(layer, x), layer(x))


needs_fbgemm = pytest.mark.skipif(not packable(torch.zeros(1), "int8"), reason="fbgemm is not in this torch build")


@needs_fbgemm
@pytest.mark.parametrize(("weights", "tolerance"), [("float16", 2e-3), ("int8", 3e-2)])
@pytest.mark.parametrize("shape", [(1, 1, 64), (1, 5, 64), (300, 64)])
def test_narrower_packed_weights_compute_the_layer_to_their_precision(weights, tolerance, shape):
    layer, linears = _layer(64, 96), PackedLinears(weights)
    x = torch.randn(*shape)
    exact = layer(x)
    assert linears(layer, x).shape == exact.shape
    assert (linears(layer, x) - exact).abs().max() <= tolerance * exact.abs().max()


@needs_fbgemm
@pytest.mark.parametrize("weights", ["float16", "int8"])
def test_a_changed_bias_is_packed_again_with_narrower_weights(weights):
    layer, linears = _layer(16, 8), PackedLinears(weights)
    x = torch.randn(3, 16)
    before = linears(layer, x)
    layer.bias.add_(10.0)
    assert torch.allclose(linears(layer, x), before + 10.0, atol=0.1)


def test_unknown_packed_weights_are_refused():
    with pytest.raises(ValueError, match="unknown packed weights 'int4'"):
        PackedLinears("int4")
