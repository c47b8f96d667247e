"""Progress on the page: the command line's bar drawn by Streamlit, and a decode's rounds as they end (AppTest)."""

import numpy as np
from streamlit.testing.v1 import AppTest

from specasr.audio import SAMPLE_RATE


def test_a_page_bar_shows_work_done_time_taken_and_what_it_decodes():
    def script():
        import streamlit as st

        import progress

        bar = progress.PageBar(total=4, desc="timed", unit="decodes")
        bar.update(3)
        bar.set_postfix_str("clip, greedy: 10 tokens")
        st.session_state["open"] = bar  # still running when the page is read

    app = AppTest.from_function(script).run()
    assert not app.exception
    (shown,) = app.get("progress")
    assert shown.proto.value == 75
    assert shown.proto.text.startswith("timed: 3 of 4 decodes · 00:00 so far, about ")
    assert shown.proto.text.endswith(" left, clip, greedy: 10 tokens")


def test_a_finished_bar_leaves_the_page():
    def script():
        import progress

        for _ in progress.PageBar(range(3), desc="windows", unit="windows"):
            pass

    app = AppTest.from_function(script).run()
    assert not app.exception and not app.get("progress")


def test_round_progress_names_the_window_and_its_seconds_and_the_time_left(sample_clips):
    def script():
        import streamlit as st

        import progress
        from specasr.audio import Clip
        from specasr.trace import Round, Settings

        report = progress.RoundProgress(st.empty(), Clip("long", st.session_state["audio"]), Settings())
        report(Round(0, 0, 0, [1, 2], 2, 3, 0.0, 0.0, 2))
        report(Round(7, 1, 40, [1, 2], 1, 3, 0.0, 0.0, 2))

    speech = sample_clips[0].clip().audio
    app = AppTest.from_function(script)
    app.session_state["audio"] = np.tile(speech, int(45 * SAMPLE_RATE / len(speech)) + 1)  # two windows
    app.run(timeout=120)
    assert not app.exception
    line = app.markdown[-1].value
    assert line.startswith("round 8: 1 of 2 proposals accepted · 42 tokens so far · window 2 of 2, ")
    assert line.endswith(" s left")


def test_round_progress_without_a_clip_counts_rounds_and_tokens():
    def script():
        import streamlit as st

        import progress
        from specasr.trace import Round

        progress.RoundProgress(st.empty())(Round(2, 0, 9, [1, 2, 3], 3, 3, 0.0, 0.0, 3))

    app = AppTest.from_function(script).run()
    assert app.markdown[-1].value == "round 3: 3 of 3 proposals accepted · 13 tokens so far"


def test_a_bar_closed_after_its_page_ran_closes_without_drawing():
    """tqdm closes a bar when it is collected, which may be after the page's script run: nothing to draw on then."""

    def script():
        import streamlit as st

        import progress

        bar = progress.PageBar(total=3, desc="timed", unit="decodes")
        bar.update(1)
        st.session_state["open"] = bar

    app = AppTest.from_function(script).run()
    bar = app.session_state["open"]
    bar.close()
    assert not app.exception and bar.disable
