"""Linear layers through oneDNN with their weights packed once, for float32 models on a CPU.

Two costs of the default (MKL) product go away: a block of a few rows (verification's K + 1) costs about what
one row does instead of growing with the rows, and MKL's slower code paths on non-Intel CPUs (a tiny.en or base
encoder pass ran about 1.4x faster through oneDNN on an AVX-512 AMD EPYC). A row also gets the same result alone
as in a block, which MKL's product does not promise.
"""

from collections.abc import Iterable

import torch
from torch import Tensor, nn


def packable(weight: Tensor) -> bool:
    return weight.device.type == "cpu" and weight.dtype == torch.float32 and torch.backends.mkldnn.is_available()


class PackedLinears:
    """Packed weights of some linear layers; `linears(layer, x)` is `layer(x)`, through oneDNN where it was packed.

    The layers stay as they are (a peer may run the same model through its own forward); the packed copy is the
    layers' weights once more in memory.
    """

    def __init__(self, layers: Iterable[nn.Linear]):
        self._packed = {
            layer: torch.ops.mkldnn._reorder_linear_weight(layer.weight.detach(), None)
            for layer in layers
            if packable(layer.weight)
        }

    def __call__(self, layer: nn.Linear, x: Tensor) -> Tensor:
        packed = self._packed.get(layer)
        if packed is None:
            return layer(x)
        return torch.ops.mkldnn._linear_pointwise(x, packed, layer.bias, "none", [], "")
