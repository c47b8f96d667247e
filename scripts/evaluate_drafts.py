"""Shipped drafts of one target on the evaluation speech: timing and acceptance side by side in one process,
with paired utterance-bootstrap intervals for the contrasts the paper predicts (audio vs no-audio, AnchorDraft
vs control).

    python -m scripts.evaluate_drafts --target whisper-tiny.en [--clips 156] [--repeats 3] [--k 4] [--speech-dir DIR]
        [--device cpu] [--dtype float32] [--draft-dtype float16]
"""

import argparse
from pathlib import Path

from specasr.bench import benchmark, summary
from specasr.dataset import DEFAULT_SPEECH_DIR, load_manifest, spread
from specasr.draft import shipped_drafts
from specasr.metrics import acceptance, paired_bootstrap
from specasr.pipeline import Pipeline
from specasr.targets import DTYPES
from specasr.trace import Settings

CONTRASTS = (("no-audio", "control"), ("no-audio", "anchordraft"), ("control", "anchordraft"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="whisper-tiny.en")
    parser.add_argument("--speech-dir", type=Path, default=DEFAULT_SPEECH_DIR)
    parser.add_argument("--clips", type=int, default=156)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--window", default="unrestricted")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=list(DTYPES))
    parser.add_argument("--draft-dtype", default=None, choices=list(DTYPES), help="default: the target's")
    args = parser.parse_args()

    names = shipped_drafts(args.target)
    if not names:
        raise SystemExit(f"no shipped drafts for {args.target} in drafts/")
    greedy = Settings(target=args.target, device=args.device, dtype=args.dtype)
    arms = {"greedy": greedy} | {
        name.split("/")[-1]: Settings(
            target=args.target,
            device=args.device,
            dtype=args.dtype,
            draft=name,
            draft_dtype=args.draft_dtype,
            k=args.k,
            window=args.window,
        )
        for name in names
    }
    clips = [u.clip() for u in spread(load_manifest(args.speech_dir), args.clips)]
    table, results = benchmark(Pipeline(), arms, clips, args.repeats)
    print(
        f"{args.target}, K={args.k}, window={args.window}, {args.device} {args.dtype} "
        f"(drafts {args.draft_dtype or args.dtype}), "
        f"{len(clips)} clips x {args.repeats} repeats"
    )
    print(summary(table, results).to_string(index=False, float_format="%.3f"))
    first = {
        name: [t for t, r in zip(result.traces, result.repeats, strict=True) if r == 0]
        for name, result in results.items()
    }
    for a, b in CONTRASTS:
        if a in first and b in first:
            for metric in ("a1", "a2c", "L"):
                interval = paired_bootstrap(first[a], first[b], lambda t, m=metric: getattr(acceptance(t), m))
                print(f"{b} - {a} {metric}: {interval.estimate:+.3f} [{interval.low:+.3f}, {interval.high:+.3f}]")


if __name__ == "__main__":
    main()
