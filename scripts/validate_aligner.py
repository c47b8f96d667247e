"""Check the offline aligner against synthesized speech's own timings (espeak-ng events or hibari-tts durations).

    python -m scripts.validate_aligner [--tts espeak|hibari] [--sentences 20] [--text ../shared/data/text/sentences.txt]

Each sentence is spoken by every voice at every rate (hibari: one voice at three speeds); prints the absolute
word-start error of PocketSphinxAligner (median, 90th percentile, max) and its median signed error (aligner minus
synthesizer) over the words the synthesizer timed, and the fraction of words the aligner placed.
"""

import argparse
import itertools
import time
from pathlib import Path

import numpy as np

from specasr.align import PocketSphinxAligner
from specasr.tts import synthesize_espeak, synthesize_hibari

DEFAULT_TEXT = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "text" / "sentences.txt"
VOICES = ("en-us", "en-us+f3", "en")
RATES_WPM = (130, 160, 190)
HIBARI_SPEEDS = (0.85, 1.0, 1.15)


def renditions(sentence: str, tts: str):
    if tts == "hibari":
        return [synthesize_hibari(sentence, speed=speed) for speed in HIBARI_SPEEDS]
    return [synthesize_espeak(sentence, voice=v, rate_wpm=r) for v, r in itertools.product(VOICES, RATES_WPM)]


def first_sentences(path: Path, count: int) -> list[str]:
    with path.open(encoding="utf-8") as lines:
        return [line.strip() for line in itertools.islice(lines, count) if line.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--text", type=Path, default=DEFAULT_TEXT, help="one sentence per line")
    parser.add_argument("--tts", choices=("espeak", "hibari"), default="espeak")
    parser.add_argument("--sentences", type=int, default=20, help="how many leading sentences to speak")
    args = parser.parse_args()

    aligner = PocketSphinxAligner()
    errors, placed, total, clips = [], 0, 0, 0
    started = time.perf_counter()
    for sentence in first_sentences(args.text, args.sentences):
        for speech in renditions(sentence, args.tts):
            aligned = aligner.align(speech.audio, sentence)
            clips += 1
            total += len(aligned)
            placed += sum(word.aligned for word in aligned)
            errors += [
                found.start - reference.start
                for reference, found in zip(speech.words, aligned, strict=True)
                if reference.aligned and found.aligned
            ]
    signed_ms = 1000 * np.array(errors)
    errors_ms = np.abs(signed_ms)
    print(f"{clips} {args.tts} clips, {total} words, {len(errors)} compared")
    print(f"word-start |error| ms: median {np.median(errors_ms):.1f}, p90 {np.percentile(errors_ms, 90):.1f}, ", end="")
    print(f"max {errors_ms.max():.1f}; median signed {np.median(signed_ms):+.1f}")
    print(f"aligned by pocketsphinx: {placed / total:.4f}; {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
