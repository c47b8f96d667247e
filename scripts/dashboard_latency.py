"""How long Live decode's Run takes beyond the decode itself, on a clip of about 30 s.

Drives the page with Streamlit's AppTest (the server's script run, without a browser): uploads the clip, presses Run
and times the script run against the pipeline's own decode calls within it (the reference pass and the speculative
decode). What is left is the page's work: storing the run with its audio, figures, tables.

    python -m scripts.dashboard_latency [--repeats 3] [--draft whisper-tiny.en/control]
"""

import argparse
import io
import statistics
import time
from pathlib import Path

import numpy as np
import soundfile
from streamlit.testing.v1 import AppTest

from specasr.audio import SAMPLE_RATE, load_audio
from specasr.dataset import load_manifest
from specasr.pipeline import Pipeline

GAP_SECONDS = 0.5
APP = Path(__file__).resolve().parents[1] / "app.py"


def thirty_second_clip() -> bytes:
    """Whole developer-set clips and short silences, up to 30 s, as WAV bytes."""
    pieces, total = [], 0
    gap = np.zeros(int(GAP_SECONDS * SAMPLE_RATE), dtype=np.float32)
    for utterance in load_manifest():
        audio = load_audio(utterance.path)
        if total + len(audio) + len(gap) > 30 * SAMPLE_RATE:
            continue
        pieces += [audio, gap]
        total += len(audio) + len(gap)
    buffer = io.BytesIO()
    soundfile.write(buffer, np.concatenate(pieces), SAMPLE_RATE, format="WAV")
    return buffer.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--draft", default="whisper-tiny.en/control")
    args = parser.parse_args()
    clip = thirty_second_clip()
    decoding = []
    decode = Pipeline.decode

    def timed_decode(self, *a, **kw):
        start = time.perf_counter()
        try:
            return decode(self, *a, **kw)
        finally:
            decoding.append(time.perf_counter() - start)

    Pipeline.decode = timed_decode
    rows = []
    for repeat in range(args.repeats + 1):  # the first loads the models: not counted
        app = AppTest.from_file(str(APP), default_timeout=600).run()
        app.sidebar.selectbox(key="draft").set_value(args.draft)
        app.sidebar.selectbox(key="draft_dtype").set_value("float16")
        app.radio(key="decode_source").set_value("upload").run()
        app.get("file_uploader")[0].upload("thirty-seconds.wav", clip).run()
        decoding.clear()
        start = time.perf_counter()
        app.button(key="run").click().run()
        wall = time.perf_counter() - start
        assert not app.exception and not app.error, (app.exception, app.error)
        if repeat:
            decoded = sum(decoding)
            rows.append((wall, decoded))
            print(f"run {repeat}: Run {wall:.2f} s, decodes within it {decoded:.2f} s, page {wall - decoded:.2f} s")
    page = [wall - decoded for wall, decoded in rows]
    print(
        f"{len(clip) / 2 / SAMPLE_RATE:.1f} s clip, {args.draft}: Run {statistics.median(r[0] for r in rows):.2f} s, "
        f"decode {statistics.median(r[1] for r in rows):.2f} s, the page's own work {statistics.median(page):.2f} s "
        f"(median of {len(rows)}; range {min(page):.2f}-{max(page):.2f} s)"
    )


if __name__ == "__main__":
    main()
