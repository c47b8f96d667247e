"""Reference frames on real speech: how many words the aligner places, and how closely the target's own
verification attention follows the aligner's token frames, per decoder layer (paper Table 7 measure).
The last line applies the paper's D.2 rule to choose the runtime-window layer.

    python -m scripts.validate_reference_frames --target whisper-tiny.en [--speech-dir DIR] [--limit N]

Choose the runtime layer on training speech (../shared/data/train-speech), never on the evaluation set.
"""

import argparse

from tqdm import tqdm

from specasr.dataset import DEFAULT_SPEECH_DIR, load_manifest
from specasr.metrics import choose_runtime_layer, peak_agreement
from specasr.pipeline import Pipeline
from specasr.targets import FRAME_SECONDS
from specasr.trace import Settings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="whisper-tiny.en")
    parser.add_argument("--speech-dir", default=DEFAULT_SPEECH_DIR)
    parser.add_argument("--aligner", default="pocketsphinx")
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--half-width-ms", type=float, default=400.0)
    args = parser.parse_args()

    # Greedy decoding that records every layer's attention peak per token, and aligns its transcript.
    settings = Settings(target=args.target, aligner=args.aligner, reference="always", verify_peaks=True)
    pipeline = Pipeline()
    utterances = load_manifest(args.speech_dir)[: args.limit]
    peaks, frames, words, aligned = [], [], 0, 0
    for utterance in tqdm(utterances, unit="utt"):
        clip = utterance.clip()
        trace = pipeline.decode(clip, settings)
        if not trace.tokens:
            continue
        reference = pipeline.reference(clip, settings)
        words += len(reference.words)
        aligned += sum(w.aligned for w in reference.words)
        peaks.append([v.verify_peaks for v in trace.verified])
        frames.append(trace.reference_frames)
    with_frame = sum(f is not None for u in frames for f in u)
    total = sum(len(u) for u in frames)
    target = pipeline.target(settings)
    print(f"{args.target} on {len(frames)} utterances of {args.speech_dir}, aligner {args.aligner}")
    print(f"words aligned: {aligned}/{words} ({100 * aligned / words:.1f}%); tokens with a frame: {with_frame}/{total}")
    half_width = round(args.half_width_ms / 1000 / FRAME_SECONDS)
    agreements = [peak_agreement(peaks, frames, layer, half_width) for layer in range(target.n_layers)]
    print("layer  tokens  pooled_r  within_r  shuffled_r  median_error_ms  inside_window")
    for a in agreements:
        print(
            f"{a.layer:>5}  {a.tokens:>6}  {a.pooled_r:8.3f}  {a.within_r:8.3f}  {a.shuffled_r:10.3f}"
            f"  {a.median_error_ms:15.0f}  {a.inside_window:13.3f}"
        )
    print(
        f"runtime layer by the D.2 rule (earliest within 0.02 of the best inside-window fraction): "
        f"{choose_runtime_layer(agreements)}"
    )


if __name__ == "__main__":
    main()
