"""Linear layers with their weights packed once for a CPU kernel: float32 weights through oneDNN, and float16 or
int8 weights through fbgemm, which computes in float32 from the narrower weights.

oneDNN takes two costs of the default (MKL) product away for float32 models on x86 CPUs: a block of a few rows
(verification's K + 1) costs about what one row does instead of growing with the rows, and MKL's slower code paths
on non-Intel CPUs (on a 2-core AVX-512 AMD EPYC, tiny.en and base decoded clips 1.3x and 1.5x faster end to end). A
row also gets the same result alone as in a block, which MKL's product does not promise.

A draft step reads its weights once per row, just after a verification pass has pushed them out of the caches, so
its time follows their bytes: fbgemm's float16 weights halve them, and int8 weights (one scale per output row, the
input quantized per call) quarter them. A step on such weights is a cheaper proposal, never a different transcript:
the target still decides every token.
"""

import platform
import warnings

import torch
from torch import Tensor, nn

ONEDNN = platform.machine().lower() in ("x86_64", "amd64") and torch.backends.mkldnn.is_available()  # as measured
FBGEMM = "fbgemm" in torch.backends.quantized.supported_engines
PACKED_WEIGHTS = ("float32", "float16", "int8")


def packable(weight: Tensor, weights: str = "float32") -> bool:
    """Whether `weight` packs for `weights`: float32 weights on a CPU with oneDNN (float32) or fbgemm (the others)."""
    kernel = ONEDNN if weights == "float32" else FBGEMM
    return kernel and weight.device.type == "cpu" and weight.dtype == torch.float32


def _pack(weight: Tensor, bias: Tensor | None, weights: str) -> Tensor:
    if weights == "float32":
        return torch.ops.mkldnn._reorder_linear_weight(weight, None)
    if weights == "float16":
        return torch.ops.quantized.linear_prepack_fp16(weight, bias)
    scales = weight.abs().amax(dim=1).clamp_min(torch.finfo(torch.float32).tiny) / 127
    zeros = torch.zeros(len(scales), dtype=torch.long)
    with warnings.catch_warnings():  # torch deprecates making quantized tensors; fbgemm's int8 kernels stay
        warnings.filterwarnings("ignore", message="torch.quantize_per_tensor", category=UserWarning)
        quantized = torch.quantize_per_channel(weight, scales.double(), zeros, 0, torch.qint8)
    return torch.ops.quantized.linear_prepack(quantized, bias)


class PackedLinears:
    """`linears(layer, x)` is `layer(x)`, through the kernel of `weights` where the layer's weight is `packable`:
    packed on first use and again once the weight or bias has changed (a tensor made under inference mode counts no
    changes in place). While autograd records a product that needs gradients, or torch.compile traces it (inductor
    packs its own), the plain layer.

    The layers stay as they are (a peer may run the same model through its own forward); a packed copy is the
    layer's weight once more in memory.
    """

    def __init__(self, weights: str = "float32"):
        if weights not in PACKED_WEIGHTS:
            raise ValueError(f"unknown packed weights {weights!r}; choose one of {', '.join(PACKED_WEIGHTS)}")
        self.weights = weights
        self._packed: dict[nn.Linear, tuple[tuple, Tensor]] = {}

    def __call__(self, layer: nn.Linear, x: Tensor) -> Tensor:
        weight, bias = layer.weight, layer.bias
        recording = torch.is_grad_enabled() and (weight.requires_grad or x.requires_grad)
        if recording or torch.compiler.is_compiling() or x.dtype != weight.dtype or not packable(weight, self.weights):
            return layer(x)
        stamp = tuple(version_stamp(t) for t in (weight, bias) if t is not None)
        stamped = self._packed.get(layer)
        if stamped is None or stamped[0] != stamp:
            stamped = self._packed[layer] = (stamp, _pack(weight.detach(), _detached(bias), self.weights))
        if self.weights == "float32":
            return torch.ops.mkldnn._linear_pointwise(x, stamped[1], bias, "none", [], "")
        if self.weights == "float16":
            return torch.ops.quantized.linear_dynamic_fp16(x, stamped[1])
        return torch.ops.quantized.linear_dynamic(x, stamped[1], True)  # reduce_range: x86's int8 products saturate


def version_stamp(tensor: Tensor) -> tuple[int, int]:
    """What changes when a tensor is written in place or replaced (inference tensors keep no version)."""
    return (0 if tensor.is_inference() else tensor._version, tensor.data_ptr())


def _detached(tensor: Tensor | None) -> Tensor | None:
    return None if tensor is None else tensor.detach()
