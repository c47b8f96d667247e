"""The decoding loops behind one interface, chosen once per decode: greedy or speculative (a chain or a draft tree),
stepped from the host (`specasr.decode`) or replayed as captured steps (`specasr.graphs`)."""

from collections.abc import Callable, MutableMapping
from typing import Protocol

from torch import Tensor

from specasr import graphs
from specasr.decode import HostGreedy, HostSpeculative, LoopOptions
from specasr.draft import Draft
from specasr.records import Decoded, Origin
from specasr.targets import Target
from specasr.trace import Round, Settings


class Loop(Protocol):
    """A decoding loop over one window's encoder output."""

    def __call__(
        self,
        memory: Tensor,
        valid_frames: int,
        origin: Origin = Origin(),
        reference: list[int | None] | None = None,
        on_round: Callable[[Round], None] | None = None,
    ) -> Decoded:
        """The segment's transcript and rows. reference: its own frame for each of its transcript tokens, for the
        windows centred from them. on_round: called with every round as it ends (its time counts as decode)."""


def loop_for(target: Target, draft: Draft | None, settings: Settings, captured: MutableMapping | None = None) -> Loop:
    """The loop `settings` decode with: greedy without a draft; static steps where `settings.graphs` (captured on
    devices that replay them, which the pipeline keeps it to; elsewhere run eagerly, which is how they are tested) or
    `settings.compile`. captured: where static steps are kept between segments and clips."""
    mode = graphs.StepMode(settings.graphs, bool(settings.compile))
    static = settings.graphs or mode.compile
    if draft is None:
        if static:
            return graphs.CapturedGreedy(target, settings.verify_peaks, captured, mode)
        return HostGreedy(target, settings.verify_peaks)
    options = LoopOptions.of(settings, target)
    if static:
        return graphs.CapturedSpeculative(target, draft, options, captured, mode)
    return HostSpeculative(target, draft, options)
