import pytest
import torch
from torch import nn

from specasr.targets.packed import PackedLinears, packable

needs_onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no oneDNN in this torch build")


def _layer(inputs: int, outputs: int, bias: bool = True) -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(inputs, outputs, bias=bias).eval()


@needs_onednn
@pytest.mark.parametrize(("shape", "bias"), [((1, 1, 64), True), ((1, 5, 64), False), ((2, 300, 64), True)])
def test_a_packed_layer_computes_the_layer(shape, bias):
    layer = _layer(64, 96, bias)
    linears = PackedLinears([layer])
    x = torch.randn(*shape)
    with torch.inference_mode():
        assert torch.allclose(linears(layer, x), layer(x), atol=1e-5, rtol=1e-5)


@needs_onednn
def test_a_row_is_the_same_alone_and_in_a_block():
    layer = _layer(384, 1536)
    linears = PackedLinears([layer])
    block = torch.randn(1, 5, 384)
    with torch.inference_mode():
        alone = torch.cat([linears(layer, block[:, i : i + 1]) for i in range(5)], dim=1)
        assert torch.equal(alone, linears(layer, block))


def test_layers_it_cannot_pack_run_as_they_are():
    half, double, unlisted = _layer(8, 4).half(), _layer(8, 4).double(), _layer(8, 4)
    linears = PackedLinears([half, double])
    assert not packable(half.weight) and not packable(double.weight)
    for layer in (half, double, unlisted):
        x = torch.randn(3, 8, dtype=layer.weight.dtype)
        assert torch.equal(linears(layer, x), layer(x))
