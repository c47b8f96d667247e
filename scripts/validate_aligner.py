"""Check the offline aligner against exact timings: espeak-ng speech, aligned by pocketsphinx, vs espeak's events.

    python -m scripts.validate_aligner [--sentences 20] [--text ../shared/data/text/sentences.txt]

Each sentence is spoken by every voice at every rate; prints the absolute word-start error of PocketSphinxAligner
(median, 90th percentile, max) over the words that espeak timed, and the fraction of words the aligner placed.
"""

import argparse
import itertools
import time
from pathlib import Path

import numpy as np

from specasr.align import PocketSphinxAligner
from specasr.tts import synthesize_espeak

DEFAULT_TEXT = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "text" / "sentences.txt"
VOICES = ("en-us", "en-us+f3", "en")
RATES_WPM = (130, 160, 190)


def first_sentences(path: Path, count: int) -> list[str]:
    with path.open(encoding="utf-8") as lines:
        return [line.strip() for line in itertools.islice(lines, count) if line.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--text", type=Path, default=DEFAULT_TEXT, help="one sentence per line")
    parser.add_argument("--sentences", type=int, default=20, help="how many leading sentences to speak")
    args = parser.parse_args()

    aligner = PocketSphinxAligner()
    errors, placed, total, clips = [], 0, 0, 0
    started = time.perf_counter()
    for sentence in first_sentences(args.text, args.sentences):
        for voice, rate in itertools.product(VOICES, RATES_WPM):
            speech = synthesize_espeak(sentence, voice=voice, rate_wpm=rate)
            aligned = aligner.align(speech.audio, sentence)
            clips += 1
            total += len(aligned)
            placed += sum(word.aligned for word in aligned)
            errors += [
                abs(found.start - reference.start)
                for reference, found in zip(speech.words, aligned, strict=True)
                if reference.aligned and found.aligned
            ]
    errors_ms = 1000 * np.array(errors)
    print(f"{clips} clips ({len(VOICES)} voices x rates {RATES_WPM} wpm), {total} words, {len(errors)} compared")
    print(f"word-start |error| ms: median {np.median(errors_ms):.1f}, p90 {np.percentile(errors_ms, 90):.1f}, ", end="")
    print(f"max {errors_ms.max():.1f}")
    print(f"aligned by pocketsphinx: {placed / total:.4f}; {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
