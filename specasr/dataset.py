"""Speech clips listed in a manifest.tsv (id, path, duration_s, speaker[, text]), read in place."""

import csv
from dataclasses import dataclass
from pathlib import Path

from specasr.audio import DEFAULT_MAX_SECONDS, Clip, load_audio

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
DEFAULT_SPEECH_DIR = SHARED_DATA / "speech"  # evaluation only: never trained or tuned on
TRAIN_SPEECH_DIR = SHARED_DATA / "train-speech"  # untranscribed, for training and tuning


@dataclass(frozen=True)
class Utterance:
    id: str
    path: Path
    duration: float
    speaker: str
    text: str  # the reference transcript; empty for untranscribed speech
    dataset: str  # the manifest's folder name

    def clip(self, max_seconds: float = DEFAULT_MAX_SECONDS) -> Clip:
        return Clip(self.id, load_audio(self.path, max_seconds), text=self.text, dataset=self.dataset)


def load_manifest(speech_dir: Path = DEFAULT_SPEECH_DIR) -> list[Utterance]:
    """Rows of `speech_dir/manifest.tsv` (id, path, duration_s, speaker, text, ...), in file order."""
    manifest = Path(speech_dir) / "manifest.tsv"
    if not manifest.is_file():
        raise FileNotFoundError(f"no manifest.tsv in {speech_dir}")
    with manifest.open(newline="") as f:
        return [
            Utterance(
                id=row["id"],
                path=manifest.parent / row["path"],
                duration=float(row["duration_s"]),
                speaker=row["speaker"],
                text=row.get("text", ""),
                dataset=manifest.parent.name,
            )
            for row in csv.DictReader(f, delimiter="\t")
        ]


def spread(utterances: list[Utterance], count: int) -> list[Utterance]:
    """`count` utterances taken at even steps through the list, so that every source of a manifest shows up."""
    return utterances[:: max(1, len(utterances) // count)][:count]
