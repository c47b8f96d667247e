"""Words a long clip loses where it is cut into windows: real clips concatenated, decoded as one clip and each part
alone, their words aligned.

    python -m scripts.segment_losses [--target whisper-tiny.en] [--count 10] [--seconds 60 90] [--trim SHARE]
        [--near 3] [--json FILE] [--show]

Each concatenation joins whole utterances of the evaluation speech set, one after another with nothing between them:
a seeded shuffle taken in order up to a length drawn within --seconds (a seed whose shuffle cannot reach the least
length is passed over). --trim keeps only that share of the last part, so that the clip ends inside speech. The
concatenation's greedy transcript (the pipeline's windows, one decode each) is aligned word for word against the
parts' own transcripts joined, both after Whisper's normaliser. Every difference is placed: at the end (within --near
words of the last word), at a window cut (within --near words of the first word after it), at a join of two parts
inside one window, or inside a part. The table counts the words lost (deleted), changed (substituted) and added
(inserted) at cuts, at the end and elsewhere (other); --show prints the windows and texts of every concatenation
that differs at a cut or at the end.
"""

import argparse
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import jiwer
import numpy as np
from tqdm import tqdm

from specasr.audio import SAMPLE_RATE, Clip
from specasr.dataset import DEFAULT_SPEECH_DIR, Utterance, load_manifest
from specasr.metrics import normalize_text
from specasr.pipeline import Pipeline
from specasr.trace import Settings, Trace

KINDS = {"delete": "lost", "substitute": "changed", "insert": "added"}
SHORT = {"lost": "lost", "changed": "chg", "added": "add"}  # the table's column names
PLACES = {"cut": ("cut",), "end": ("end",), "other": ("join", "inside")}


@dataclass
class Difference:
    place: str  # end, cut, join (two parts inside one window) or inside (a part)
    kind: str  # lost, changed or added
    alone: str  # the parts' words (empty for added words)
    joined: str  # the concatenation's words (empty for lost words)
    cut: int | None = None  # which window cut (0: the first), where place is cut

    @property
    def words(self) -> int:
        return len((self.joined if self.kind == "added" else self.alone).split())


@dataclass
class Concatenation:
    id: str
    seconds: float
    parts: list[dict]  # id, start and end seconds, transcript alone
    windows: list[dict]  # start and end seconds, transcript
    differences: list[Difference] = field(default_factory=list)

    def count(self, places: tuple[str, ...], kinds: tuple[str, ...]) -> int:
        return sum(d.words for d in self.differences if d.place in places and d.kind in kinds)


def concatenations(
    utterances: list[Utterance], count: int, seed: int, seconds: tuple[float, float]
) -> list[list[Utterance]]:
    """`count` lists of utterances, each between `seconds` (least, most) long in all: a seeded shuffle of the whole
    set, taken in order until a length drawn between the two is reached."""
    chosen = []
    while len(chosen) < count:
        rng = np.random.default_rng(seed)
        parts, total, length = [], 0.0, rng.uniform(*seconds)
        for i in rng.permutation(len(utterances)):
            if total >= length:
                break
            if total + utterances[i].duration <= seconds[1]:
                parts.append(utterances[i])
                total += utterances[i].duration
        if total >= seconds[0]:
            chosen.append(parts)
        seed += 1
    return chosen


def words(text: str) -> list[str]:
    return normalize_text(text).split()


def differences(alone: list[list[str]], joined: list[list[str]], near: int) -> list[Difference]:
    """Where the windows' words (`joined`, one list per window) differ from the parts' (`alone`, one list per part)."""
    reference = [w for part in alone for w in part]
    hypothesis = [w for window in joined for w in window]
    cuts = np.cumsum([len(window) for window in joined])[:-1]  # each later window's first word
    joins = np.cumsum([len(part) for part in alone])[:-1]  # each later part's first word
    found = []
    for chunk in jiwer.process_words(" ".join(reference), " ".join(hypothesis)).alignments[0]:
        if chunk.type == "equal":
            continue
        difference = Difference(
            "inside",
            KINDS[chunk.type],
            " ".join(reference[chunk.ref_start_idx : chunk.ref_end_idx]),
            " ".join(hypothesis[chunk.hyp_start_idx : chunk.hyp_end_idx]),
        )
        near_cuts = [i for i, c in enumerate(cuts) if chunk.hyp_start_idx - near <= c <= chunk.hyp_end_idx + near]
        if chunk.ref_end_idx >= len(reference) - near or chunk.hyp_end_idx >= len(hypothesis) - near:
            difference.place = "end"
        elif near_cuts:
            difference.place, difference.cut = "cut", near_cuts[0]
        elif any(chunk.ref_start_idx - near <= j <= chunk.ref_end_idx + near for j in joins):
            difference.place = "join"
        found.append(difference)
    return found


def window_texts(pipeline: Pipeline, trace: Trace, settings: Settings) -> list[dict]:
    target = pipeline.target(settings)
    return [
        {
            "start": round(s.start_frame * trace.frame_seconds, 2),
            "end": round(min((s.start_frame + s.valid_frames) * trace.frame_seconds, trace.clip_seconds), 2),
            "text": target.decode_text(trace.tokens[s.first_token : s.first_token + s.tokens]),
        }
        for s in trace.segments
    ]


def measure(
    target: str,
    count: int,
    seed: int = 0,
    near: int = 3,
    seconds: tuple[float, float] = (60.0, 90.0),
    trim: float | None = None,
) -> list[Concatenation]:
    pipeline, settings = Pipeline(), Settings(target=target, draft=None, verify_peaks=False)
    chosen = concatenations(load_manifest(DEFAULT_SPEECH_DIR), count, seed, seconds)
    alone: dict[str, str] = {}  # a part's own transcript, decoded once
    results = []
    with tqdm(total=sum(len(parts) + 1 for parts in chosen), desc=target, unit="decode") as progress:
        for index, parts in enumerate(chosen):
            clips = [part.clip() for part in parts]
            if trim is not None:
                kept = clips[-1].audio[: int(len(clips[-1].audio) * trim)]
                clips[-1] = Clip(f"{clips[-1].id}[:{len(kept) / SAMPLE_RATE:.2f}s]", kept)
            for clip in clips:
                if clip.id not in alone:
                    alone[clip.id] = pipeline.decode(clip, settings).text
                progress.update()
            trace = pipeline.decode(Clip(f"concatenation-{index}", np.concatenate([c.audio for c in clips])), settings)
            progress.update()
            ends = np.cumsum([clip.seconds for clip in clips])
            result = Concatenation(
                trace.clip_id,
                round(trace.clip_seconds, 2),
                [
                    {"id": clip.id, "start": round(end - clip.seconds, 2), "end": round(end, 2), "text": alone[clip.id]}
                    for clip, end in zip(clips, ends, strict=True)
                ],
                window_texts(pipeline, trace, settings),
            )
            result.differences = differences(
                [words(p["text"]) for p in result.parts], [words(w["text"]) for w in result.windows], near
            )
            results.append(result)
    return results


def show(result: Concatenation) -> None:
    print(f"\n{result.id} ({result.seconds:.1f} s)")
    for part in result.parts:
        print(f"  part   {part['start']:6.2f}-{part['end']:6.2f} {part['id']}: ...{part['text'][-70:]}")
    for window in result.windows:
        print(f"  window {window['start']:6.2f}-{window['end']:6.2f}: {window['text'][:60]} ... {window['text'][-60:]}")
    for d in result.differences:
        where = f"cut {d.cut}" if d.place == "cut" else d.place
        print(f"  {where:>9} {d.kind:>7}: alone {d.alone!r} -> joined {d.joined!r}")


def table(results: list[Concatenation]) -> None:
    columns = [(place, kind) for place in PLACES for kind in KINDS.values()]
    print(f"\n{'clip':<17}{'s':>7}{'win':>5}{'parts':>6}" + "".join(f"{f'{p} {SHORT[k]}':>11}" for p, k in columns))
    for name, rows in [*((r.id, [r]) for r in results), ("total", results)]:
        seconds = sum(r.seconds for r in rows)
        windows, parts = sum(len(r.windows) for r in rows), sum(len(r.parts) for r in rows)
        counts = "".join(f"{sum(r.count(PLACES[p], (k,)) for r in rows):>11d}" for p, k in columns)
        print(f"{name:<17}{seconds:7.1f}{windows:5d}{parts:6d}{counts}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="whisper-tiny.en")
    parser.add_argument("--count", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seconds", type=float, nargs=2, default=(60.0, 90.0), help="least and most length")
    parser.add_argument("--trim", type=float, default=None, help="keep this share of the last part: end inside speech")
    parser.add_argument("--near", type=int, default=3, help="words either side of a cut or the end that count there")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--show", action="store_true", help="windows and texts where a cut or the end differs")
    args = parser.parse_args()

    results = measure(args.target, args.count, args.seed, args.near, tuple(args.seconds), args.trim)
    if args.show:
        for result in results:
            if result.count(("cut", "end"), tuple(KINDS.values())):
                show(result)
    table(results)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        options = vars(args) | {"json": str(args.json)}
        args.json.write_text(json.dumps({**options, "concatenations": [asdict(r) for r in results]}, indent=1) + "\n")


if __name__ == "__main__":
    main()
