"""Check the offline aligner against synthesized speech's own timings (espeak-ng events or hibari-tts durations):
the aligner's floor under every anchor error.

    python -m scripts.validate_aligner [--tts espeak,hibari] [--sentences 20] [--targets whisper-tiny.en,whisper-base]
        [--text ../shared/data/text/sentences.txt] [--json FILE]

Each sentence is spoken by every voice at every rate (hibari: one voice at three speeds). Per synthesizer it prints
the absolute word-start error of PocketSphinxAligner (median, 90th percentile, max), its median signed error
(aligner minus synthesizer) over the words the synthesizer timed, and the fraction of words the aligner placed; then
per target the token-frame error: the sentence in the target's tokens, each token's reference frame taken through
the token-to-frame rule (`specasr.reference`) once from the synthesizer's word times and once from the aligner's,
and |aligner - truth| in encoder frames over the tokens both place (mean, median, 90th percentile, share within one
frame). The mean is what Table 12's anchor errors (means over proposals, in frames) stand on.
"""

import argparse
import itertools
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from specasr.align import PocketSphinxAligner
from specasr.reference import frames_from_words
from specasr.targets import Target, load_target
from specasr.tts import SynthesizedSpeech, synthesize_espeak, synthesize_hibari
from specasr.words import WordTime

DEFAULT_TEXT = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "text" / "sentences.txt"
VOICES = ("en-us", "en-us+f3", "en")
RATES_WPM = (130, 160, 190)
HIBARI_SPEEDS = (0.85, 1.0, 1.15)


def renditions(sentence: str, tts: str) -> list[SynthesizedSpeech]:
    if tts == "hibari":
        return [synthesize_hibari(sentence, speed=speed) for speed in HIBARI_SPEEDS]
    return [synthesize_espeak(sentence, voice=v, rate_wpm=r) for v, r in itertools.product(VOICES, RATES_WPM)]


def first_sentences(path: Path, count: int) -> list[str]:
    with path.open(encoding="utf-8") as lines:
        return [line.strip() for line in itertools.islice(lines, count) if line.strip()]


def token_frame_errors(target: Target, speech: SynthesizedSpeech, aligned: list[WordTime], text: str) -> list[int]:
    """|aligner - truth| in encoder frames for each of the sentence's tokens that both word timings place: the
    aligner's word times (`aligned`, of `text`) and the synthesizer's through the same token-to-frame rule."""
    tokens = target.tokenizer.encode(" " + text, add_special_tokens=False)
    truth, found = (frames_from_words(target, tokens, words, len(speech.audio)) for words in (speech.words, aligned))
    return [abs(f - t) for f, t in zip(found, truth, strict=True) if f is not None and t is not None]


@dataclass
class Floor:
    """The aligner's token-frame error on one synthesizer's clips through one target's tokens."""

    tts: str
    target: str
    clips: int
    tokens: int  # tokens both timings place
    mean_frames: float
    median_frames: float
    p90_frames: float
    within_one_frame: float
    frame_ms: float


def floor(tts: str, target: str, errors: list[int], clips: int, frame_seconds: float) -> Floor:
    found = np.asarray(errors, dtype=float)
    return Floor(
        tts,
        target,
        clips,
        len(found),
        float(found.mean()),
        float(np.median(found)),
        float(np.percentile(found, 90)),
        float((found <= 1).mean()),
        frame_seconds * 1000,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--text", type=Path, default=DEFAULT_TEXT, help="one sentence per line")
    parser.add_argument("--tts", default="espeak", help="espeak, hibari or both, comma-separated")
    parser.add_argument("--sentences", type=int, default=20, help="how many leading sentences to speak")
    parser.add_argument("--targets", default="", help="targets whose token-frame error to measure, comma-separated")
    parser.add_argument("--json", type=Path, help="also write every figure to this file")
    args = parser.parse_args()

    aligner = PocketSphinxAligner()
    targets = {name: load_target(name) for name in filter(None, args.targets.split(","))}
    record = {"command": "python -m scripts.validate_aligner " + " ".join(_argv(args)), "words": [], "floors": []}
    for tts in args.tts.split(","):
        word_errors, placed, total, clips = [], 0, 0, 0
        frame_errors = {name: [] for name in targets}
        started = time.perf_counter()
        for sentence in tqdm(first_sentences(args.text, args.sentences), desc=tts, unit="sentence"):
            for speech in renditions(sentence, tts):
                aligned = aligner.align(speech.audio, sentence)
                clips += 1
                total += len(aligned)
                placed += sum(word.aligned for word in aligned)
                word_errors += [
                    found.start - reference.start
                    for reference, found in zip(speech.words, aligned, strict=True)
                    if reference.aligned and found.aligned
                ]
                for name, target in targets.items():
                    frame_errors[name] += token_frame_errors(target, speech, aligned, sentence)
        signed_ms = 1000 * np.array(word_errors)
        errors_ms = np.abs(signed_ms)
        words = {
            "tts": tts,
            "clips": clips,
            "words": total,
            "compared": len(word_errors),
            "median_ms": float(np.median(errors_ms)),
            "p90_ms": float(np.percentile(errors_ms, 90)),
            "max_ms": float(errors_ms.max()),
            "median_signed_ms": float(np.median(signed_ms)),
            "placed": placed / total,
            "seconds": time.perf_counter() - started,
        }
        record["words"].append(words)
        print(f"{clips} {tts} clips, {total} words, {len(word_errors)} compared")
        print(f"word-start |error| ms: median {words['median_ms']:.1f}, p90 {words['p90_ms']:.1f}, ", end="")
        print(f"max {words['max_ms']:.1f}; median signed {words['median_signed_ms']:+.1f}")
        print(f"aligned by pocketsphinx: {words['placed']:.4f}; {words['seconds']:.1f} s")
        for name, target in targets.items():
            found = floor(tts, name, frame_errors[name], clips, target.frame_seconds)
            record["floors"].append(asdict(found))
            print(
                f"{name} token frames, |aligner - truth|: mean {found.mean_frames:.2f}, median "
                f"{found.median_frames:.1f}, p90 {found.p90_frames:.1f} frames; within one frame "
                f"{found.within_one_frame:.3f} of {found.tokens} tokens"
            )
    if args.json:
        args.json.write_text(json.dumps(record, indent=1) + "\n")


def _argv(args: argparse.Namespace) -> list[str]:
    return [f"--tts {args.tts}", f"--sentences {args.sentences}"] + ([f"--targets {args.targets}"] * bool(args.targets))


if __name__ == "__main__":
    main()
