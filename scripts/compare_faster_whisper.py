"""Check the converted weights against faster-whisper's CTranslate2 runtime on the same bundled weights.

Both sides get the same log-mel features (transformers' WhisperFeatureExtractor) and decode greedily
in float32 without timestamps. Prints token-exact agreement and both WERs.

    python -m scripts.compare_faster_whisper --target whisper-base [--limit N] [--json]
"""

import argparse
import json

import ctranslate2
from tqdm import tqdm

from specasr.dataset import DEFAULT_SPEECH_DIR, load_manifest
from specasr.metrics import word_error_rate
from specasr.pipeline import Pipeline
from specasr.targets.builtin import bundled_ct2_dir
from specasr.trace import Settings


def ct2_greedy(model: ctranslate2.models.Whisper, features, prompt: tuple[int, ...]) -> list[int]:
    storage = ctranslate2.StorageView.from_array(features.float().cpu().numpy())
    return model.generate(storage, [list(prompt)], beam_size=1, max_length=448)[0].sequences_ids[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="whisper-tiny.en")
    parser.add_argument("--speech-dir", default=DEFAULT_SPEECH_DIR)
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = parser.parse_args()

    pipeline, settings = Pipeline(), Settings(target=args.target, verify_peaks=False)
    target = pipeline.target(settings)
    peer = ctranslate2.models.Whisper(str(bundled_ct2_dir(args.target)), device="cpu", compute_type="float32")
    utterances = load_manifest(args.speech_dir)[: args.limit]
    ours, theirs = [], []
    for utterance in tqdm(utterances, unit="utt"):
        clip = utterance.clip()
        ours.append(pipeline.decode(clip, settings).tokens)
        theirs.append(ct2_greedy(peer, target.features(clip.audio), target.prompt))
    same = sum(a == b for a, b in zip(ours, theirs, strict=True))
    references = [u.text for u in utterances]
    wer = {name: word_error_rate(references, [target.decode_text(t) for t in tokens]) for name, tokens in
           (("specasr", ours), ("ctranslate2", theirs))}  # fmt: skip
    if args.json:
        print(json.dumps({"target": args.target, "clips": len(utterances), "token_exact": same, "wer": wer}))
        return
    print(f"{args.target}: token-exact on {same}/{len(utterances)} clips ({100 * same / len(utterances):.1f}%)")
    print(f"WER specasr {100 * wer['specasr']:.2f}%")
    print(f"WER ctranslate2 {100 * wer['ctranslate2']:.2f}%")


if __name__ == "__main__":
    main()
