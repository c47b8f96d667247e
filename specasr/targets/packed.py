"""Linear layers through oneDNN with their weights packed once, for float32 models on x86 CPUs.

Two costs of the default (MKL) product go away: a block of a few rows (verification's K + 1) costs about what
one row does instead of growing with the rows, and MKL's slower code paths on non-Intel CPUs (on a 2-core AVX-512
AMD EPYC, tiny.en and base decoded clips 1.3x and 1.5x faster end to end). A row also gets the same result alone
as in a block, which MKL's product does not promise.
"""

import platform

import torch
from torch import Tensor, nn

ONEDNN = platform.machine().lower() in ("x86_64", "amd64") and torch.backends.mkldnn.is_available()  # as measured


def packable(weight: Tensor) -> bool:
    return ONEDNN and weight.device.type == "cpu" and weight.dtype == torch.float32


class PackedLinears:
    """`linears(layer, x)` is `layer(x)`, through oneDNN where the weight is `packable`: packed on first use and
    again once the weight has changed (a weight made under inference mode counts no changes in place). While
    autograd records a product that needs gradients, or torch.compile traces it (inductor packs its own), the plain
    layer.

    The layers stay as they are (a peer may run the same model through its own forward); a packed copy is the
    layer's weight once more in memory.
    """

    def __init__(self):
        self._packed: dict[nn.Linear, tuple[tuple[int, int], Tensor]] = {}

    def __call__(self, layer: nn.Linear, x: Tensor) -> Tensor:
        weight = layer.weight
        recording = torch.is_grad_enabled() and (weight.requires_grad or x.requires_grad)
        if recording or torch.compiler.is_compiling() or x.dtype != weight.dtype or not packable(weight):
            return layer(x)
        stamp = (0 if weight.is_inference() else weight._version, weight.data_ptr())  # inference tensors keep none
        stamped = self._packed.get(layer)
        if stamped is None or stamped[0] != stamp:
            stamped = self._packed[layer] = (stamp, torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None))
        return torch.ops.mkldnn._linear_pointwise(x, stamped[1], layer.bias, "none", [], "")
