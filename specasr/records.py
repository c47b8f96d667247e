"""What a loop reads back from the device, and the trace rows it makes of it: where a segment starts in its clip
(`Origin`), what a loop produced (`Decoded`), a round's one read (`RoundRecord`: packed on the device, unpacked on the
host into an `Outcome`) and a segment's rows in clip coordinates (`SegmentRows`)."""

from dataclasses import dataclass, field

import torch
from torch import Tensor

from specasr import tree
from specasr.targets import Target
from specasr.trace import DraftStep, Round, VerifiedToken
from specasr.windows import NO_WINDOW, WindowPolicy


@dataclass(frozen=True)
class Origin:
    """Where a segment starts in its clip; the loops record rows in clip coordinates."""

    segment: int = 0
    frame: int = 0
    token: int = 0
    round: int = 0


@dataclass
class Decoded:
    """What a loop produced for one segment: its transcript tokens and its trace rows."""

    tokens: list[int]
    rounds: list[Round] = field(default_factory=list)
    steps: list[DraftStep] = field(default_factory=list)
    verified: list[VerifiedToken] = field(default_factory=list)
    runtime_peaks: list[int] = field(default_factory=list)  # a runtime window's readout, a frame per token


@dataclass
class Outcome:
    """A round read back on the host: the nodes it kept (parents before children; a chain's proposals in order), the
    accepted path through them and what the trace rows need."""

    new: list[int]  # the tokens the round adds: the accepted path's, then the target's own next (the correction)
    tokens: list[int]
    parents: list[int]  # each node's parent among the nodes; -1 below the root
    depths: list[int]
    probabilities: list[float]  # the draft's, of each node's token below its parent
    path: list[int]  # the accepted nodes, depth 1 first
    draft_peaks: list[int] | None  # each node's draft attention peak (segment frame); None without audio attention
    centres: list[int]  # each depth's window centre (segment frame) or NO_WINDOW
    peaks: list[int]  # verification peaks of the root and the path's nodes, row by row, a frame per attention layer
    drafted: int = 0  # the round's draft passes (set by the loop, which knows how deep it drafted)
    attention: list[list[float]] | None = None  # each node's draft attention row, where the trace keeps them


@dataclass(frozen=True)
class RoundRecord:
    """The layout of what a round hands the host in one read (float64, so probabilities travel with the integers):
    `pack` on the device, `unpack` on the host. N nodes, a path of K + 1 rows, `layers` attention layers."""

    nodes: int
    depth: int
    layers: int

    def sizes(self) -> dict[str, int]:
        n, k = self.nodes, self.depth
        return {
            "limit": 1,  # the deepest a node could be kept at: the length limit, a chain's confidence stop
            "accepted": 1,
            "new": k + 1,  # the target's choices along the path
            "tokens": n,
            "parents": n + 1,  # the block's parent rows, the root's own first
            "depths": n + 1,
            "probabilities": n,
            "path": k + 1,  # block rows
            "draft_peaks": n,
            "centres": k,
            "peaks": (k + 1) * self.layers,  # of the path's rows
        }

    def pack(
        self,
        block: tree.Block,
        limit: Tensor,
        accepted: Tensor,
        path: Tensor,
        choices: Tensor,
        peaks: Tensor,
        draft_peaks: Tensor,
        centres: Tensor,
    ) -> Tensor:
        """A verified block's record: `choices` and `peaks` are the verification's, row by row; `path` its rows the
        target accepted (`tree.accept`)."""
        parts = {
            "limit": limit,
            "accepted": accepted,
            "new": choices.index_select(0, path),
            "tokens": block.tokens,
            "parents": block.parents,
            "depths": block.depths,
            "probabilities": block.probabilities,
            "path": path,
            "draft_peaks": draft_peaks,
            "centres": centres,
            "peaks": peaks.index_select(0, path),
        }
        return torch.cat([parts[name].reshape(-1).double() for name in self.sizes()])

    def unpack(self, values: list[float], audio: bool) -> Outcome:
        """The round's nodes no deeper than its limit, counted among themselves."""
        parts, at = {}, 0
        for name, size in self.sizes().items():
            parts[name], at = values[at : at + size], at + size
        probabilities = parts.pop("probabilities")
        whole = {name: [int(v) for v in found] for name, found in parts.items()}
        (limit,), (accepted,) = whole["limit"], whole["accepted"]
        kept = [i for i, depth in enumerate(whole["depths"][1:]) if depth <= limit]
        index = {node: i for i, node in enumerate(kept)}
        return Outcome(
            new=whole["new"][: accepted + 1],
            tokens=[whole["tokens"][i] for i in kept],
            parents=[index.get(whole["parents"][i + 1] - 1, -1) for i in kept],
            depths=[whole["depths"][i + 1] for i in kept],
            probabilities=[probabilities[i] for i in kept],
            path=[index[row - 1] for row in whole["path"][1 : accepted + 1]],
            draft_peaks=[whole["draft_peaks"][i] for i in kept] if audio else None,
            centres=whole["centres"],
            peaks=whole["peaks"][: (accepted + 1) * self.layers],
        )


class SegmentRows:
    """A segment's transcript and trace rows in clip coordinates, built from what a loop read back from the device."""

    def __init__(
        self,
        target: Target,
        origin: Origin,
        verify_peaks: bool,
        layers: int,
        policy: WindowPolicy | None = None,
        readout: int | None = None,
    ):
        """readout: which of the `layers` attention layers a runtime window reads (`readout_column`), or None."""
        self.eot, self.origin, self.policy = target.eot, origin, policy
        self.verify_peaks, self.layers, self.readout = verify_peaks, layers, readout
        self.result = Decoded([])
        self.tokens = self.result.tokens

    def verified(self, new: list[int], peaks: list[int]) -> bool:
        """Tokens `new` follow the transcript (the last may be end-of-text); `peaks` holds, row by row, the frame each
        attention layer peaked at while predicting them. Whether the transcript ended."""
        finished = new[-1] == self.eot
        taken = new[:-1] if finished else new
        start, n, frame = self.origin.token + len(self.tokens), self.layers, self.origin.frame
        if self.verify_peaks:
            self.result.verified += [
                VerifiedToken(start + i, token, [p + frame for p in peaks[i * n : (i + 1) * n]])
                for i, token in enumerate(taken)
            ]
        if self.readout is not None:
            self.result.runtime_peaks += [peaks[i * n + self.readout] + frame for i in range(len(taken))]
        self.tokens += taken
        return finished

    def round(self, outcome: Outcome, seconds: tuple[float, float]) -> bool:
        """One round: its nodes, the path the target accepted and its own next token, and the seconds of drafting
        and of verification. Whether the transcript ended."""
        new = outcome.new
        if self.eot in new:
            new = new[: new.index(self.eot) + 1]
        index, start, origin = self.origin.round + len(self.result.rounds), len(self.tokens), self.origin
        accepted = len(outcome.path)
        self.result.rounds.append(
            Round(
                index,
                origin.segment,
                origin.token + start,
                outcome.tokens,
                accepted,
                outcome.new[-1],
                *seconds,
                outcome.drafted,
            )
        )
        on_path, offset = set(outcome.path), origin.frame
        for node, (token, depth) in enumerate(zip(outcome.tokens, outcome.depths, strict=True)):
            centre, reference = outcome.centres[depth - 1], self.policy.reference_frame(start + depth - 1)
            parent = outcome.parents[node]
            self.result.steps.append(
                DraftStep(
                    round=index,
                    depth=depth,
                    token=token,
                    accepted=node in on_path,
                    draft_peak=None if outcome.draft_peaks is None else outcome.draft_peaks[node] + offset,
                    window_centre=None if centre == NO_WINDOW else centre + offset,
                    reference_frame=None if reference is None else reference + offset,
                    attention=None if outcome.attention is None else outcome.attention[node],
                    node=node,
                    parent=None if parent < 0 else parent,
                    probability=outcome.probabilities[node],
                )
            )
        return self.verified(new, outcome.peaks)
