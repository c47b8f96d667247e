"""A target's LM head: vocabulary scores, and the exact greedy choice over them.

A float32 head is the largest thing a CPU decoding step reads (tiny.en: 80 MB of its 136), and CPU BLAS streams it
for the few rows of a step at a fraction of memory speed. The greedy choice needs only the largest score, so where
fbgemm's float16-weight kernel exists the head first scores every token from a float16 copy (half the bytes, float32
arithmetic), bounds each score's error, and rescores in float32 only the tokens whose bound reaches the best one's.
The choice is the argmax of those float32 scores, as the plain product would give it.
"""

import torch
from torch import Tensor

FLOAT16_EPSILON = 2.0**-11  # unit roundoff of float16
FLOAT32_EPSILON = 2.0**-24
MOST_CANDIDATES = 256  # per row, rescored in float32; beyond that the plain product is the cheaper way


def vocabulary_logits(hidden: Tensor, weight: Tensor) -> Tensor:
    """hidden @ weight.T, with the vocabulary-sized matrix on the left of the product.

    For the few rows of a decoding step CPU BLAS runs this layout several times faster (an earlier 2-core EPYC VM,
    tiny.en's 51,864 x 384 head: 2 rows 1.6 ms instead of 10.5, 5 rows 2.5 instead of 8.5). A lone row is doubled
    because the matrix-vector kernel is as slow as the other layout (5.5 ms; doubled, 2.2).
    """
    rows = hidden.reshape(-1, hidden.shape[-1])
    n = rows.shape[0]
    if n == 1:
        rows = rows.repeat(2, 1)
    return (weight @ rows.T)[:, :n].T.reshape(*hidden.shape[:-1], -1)


class VocabularyHead:
    """The (vocab, d_model) output projection of a frozen target."""

    def __init__(self, weight: Tensor):
        self.weight = weight
        self.screen = Float16Screen(weight) if Float16Screen.applies_to(weight) else None

    def logits(self, states: Tensor) -> Tensor:
        """Scores of every token for final decoder states (..., d_model)."""
        return vocabulary_logits(states, self.weight)

    def choose(self, states: Tensor, banned: Tensor | None = None) -> Tensor:
        """The highest-scoring token for each row of states (..., d_model), never one `banned` marks (a boolean mask
        over the vocabulary that broadcasts against the scores)."""
        rows = states.reshape(-1, states.shape[-1])
        if banned is not None:
            banned = banned.expand(*states.shape[:-1], self.weight.shape[0]).reshape(rows.shape[0], -1)
        screened = self.screen is not None and not torch.compiler.is_compiling()  # its candidates vary in number
        found = self.screen.candidates(rows, banned) if screened else None
        if found is None:
            scores = vocabulary_logits(rows, self.weight)
            if banned is not None:
                scores = scores.masked_fill(banned, float("-inf"))
        else:
            row, token = found
            scores = torch.full((rows.shape[0], self.weight.shape[0]), float("-inf"), dtype=rows.dtype)
            scores[row, token] = (self.weight[token] * rows[row]).sum(dim=-1)  # the same sum for a row in any block
        return scores.argmax(dim=-1).view(states.shape[:-1])


class Float16Screen:
    """Which tokens of a float32 head may hold a row's largest score, read from a float16 copy of the head.

    For states h and a head row w with float16 copy w', the kernel's score s' = h.w' in float32 differs from the
    float32 score s = h.w by at most |h| |w' - w| + (u16 + 2 d u32) |h| |w'|, by Cauchy-Schwarz and the usual
    rounding bounds (u16 covers a kernel that rounded h to float16 too; 2 d u32 both products' accumulation). Only a
    token whose s' + bound reaches the largest s' - bound can hold the largest s.
    """

    def __init__(self, weight: Tensor):
        self.packed = torch.ops.quantized.linear_prepack_fp16(weight, None)
        rounded, _ = torch.ops.quantized.linear_unpack_fp16(self.packed)
        slack = FLOAT16_EPSILON + 2 * weight.shape[1] * FLOAT32_EPSILON
        # 1.01 covers the rounding of the norms themselves
        self.row_error = 1.01 * ((rounded - weight).norm(dim=1) + slack * rounded.norm(dim=1))

    @staticmethod
    def applies_to(weight: Tensor) -> bool:
        return (
            weight.device.type == "cpu"
            and weight.dtype == torch.float32
            and "fbgemm" in torch.backends.quantized.supported_engines
            and bool(weight.abs().max() < torch.finfo(torch.float16).max)  # no saturated copy
        )

    def candidates(self, rows: Tensor, banned: Tensor | None) -> tuple[Tensor, Tensor] | None:
        """(row, token) index pairs that may hold each row's largest float32 score; None where the bound leaves so
        many that the plain product is cheaper (states near zero, or not finite)."""
        approx = torch.ops.quantized.linear_dynamic_fp16(rows, self.packed)
        if banned is not None:
            approx = approx.masked_fill(banned, float("-inf"))
        error = rows.norm(dim=1, keepdim=True) * self.row_error
        floor = (approx - error).amax(dim=1, keepdim=True)
        row, token = (approx + error >= floor).nonzero(as_tuple=True)
        if not 0 < len(token) <= MOST_CANDIDATES * len(rows):
            return None
        return row, token
