"""Progress of the dashboard's long work on the page: the command line's tqdm bars drawn by Streamlit, and a decode's
rounds as they end."""

import io
import time

import streamlit as st
from streamlit.runtime.scriptrunner import get_script_run_ctx
from tqdm import tqdm

from specasr import SAMPLE_RATE, Clip, Round, Settings, split_windows
from widgets import pipeline


class RoundProgress:
    """A decode's live progress line: rounds done and tokens so far; where the clip's windows are known, the 30 s
    window of audio being decoded and, from the second window on, the time left at the pace of the windows done."""

    def __init__(self, placeholder, clip: Clip | None = None, settings: Settings | None = None):
        self.placeholder, self.bounds, self.first_round_at = placeholder, None, None
        if clip is not None:
            target = pipeline().target(settings)
            cuts = split_windows(clip.audio, target.window_samples, target.cut_samples)
            self.bounds = [start / SAMPLE_RATE for start, _ in cuts] + [clip.seconds]

    def __call__(self, round: Round) -> None:
        line = (
            f"round {round.index + 1}: {round.accepted} of {len(round.proposed)} proposals accepted · "
            f"{round.start + round.accepted + 1} tokens so far"
        )
        if self.bounds is not None:
            now = time.perf_counter()
            self.first_round_at = self.first_round_at or now
            start, end, seconds = self.bounds[round.segment], self.bounds[round.segment + 1], self.bounds[-1]
            line += (
                f" · window {round.segment + 1} of {len(self.bounds) - 1}, {start:.1f}-{end:.1f} s of {seconds:.1f} s"
            )
            if start > 0:  # the windows before this one were decoded at this pace
                line += f" · about {(now - self.first_round_at) / start * (seconds - start):.0f} s left"
        self.placeholder.write(line)


def on_page() -> bool:
    """Whether this thread runs a page's script: tqdm closes a bar it collects, maybe after the page's run ended."""
    return get_script_run_ctx(suppress_warning=True) is not None


class PageBar(tqdm):
    """The command line's progress bar (tqdm) drawn on the page: work done, time taken and, once tqdm has a pace,
    the time left."""

    monitor_interval = 0  # tqdm's monitor thread would draw from outside the page's script thread

    def __init__(self, *args, **kwargs):
        self._bar = st.empty()
        meter = "{desc}: {n_fmt} of {total_fmt} {unit} · {elapsed} so far, about {remaining} left{postfix}"
        super().__init__(*args, mininterval=0, bar_format=meter, file=io.StringIO(), **kwargs)

    def display(self, msg: str | None = None, pos: int | None = None) -> bool:
        if not on_page():
            return False
        done = self.n / self.total if self.total else 0.0
        self._bar.progress(min(done, 1.0), text=self.format_meter(**self.format_dict))
        return True

    def close(self) -> None:
        closing = not self.disable  # tqdm closes again when collected
        super().close()
        if closing and on_page():
            self._bar.empty()  # the finished work's result says the rest
