"""Speech clips listed in a manifest.tsv (id, path, duration_s, speaker[, text]), read in place."""

import csv
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from specasr.audio import DEFAULT_MAX_SECONDS, Clip, load_audio

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
DEFAULT_SPEECH_DIR = SHARED_DATA / "speech"  # evaluation only: never trained or tuned on
TRAIN_SPEECH_DIR = SHARED_DATA / "train-speech"  # untranscribed, for training and tuning
TRAIN_SPEECH_2_DIR = SHARED_DATA / "train-speech-2"  # more training speech; a held-out part is kept for tuning
HELDOUT_IDS = Path(__file__).with_name("heldout-train-speech-2.txt")


@dataclass(frozen=True)
class Utterance:
    id: str
    path: Path
    duration: float
    speaker: str
    text: str  # the reference transcript; empty for untranscribed speech
    dataset: str  # the manifest's folder name
    subset: str  # the evaluation set: the manifest's subset column, else the id's prefix (evaluation_set)

    def clip(self, max_seconds: float = DEFAULT_MAX_SECONDS) -> Clip:
        audio = load_audio(self.path, max_seconds)
        return Clip(self.id, audio, text=self.text, dataset=self.dataset, path=str(self.path.resolve()))


def manifest_file(data: Path | str) -> Path:
    """A manifest.tsv, given as the file or its folder."""
    path = Path(data)
    return path / "manifest.tsv" if path.is_dir() else path


def load_manifest(speech_dir: Path = DEFAULT_SPEECH_DIR) -> list[Utterance]:
    """Rows of a manifest.tsv, or of `speech_dir/manifest.tsv` (id, path, duration_s, speaker, text, ...; an optional
    subset column), in file order."""
    manifest = manifest_file(speech_dir)
    if not manifest.is_file():
        raise FileNotFoundError(f"no manifest {manifest}")
    with manifest.open(newline="") as f:
        return [
            Utterance(
                id=row["id"],
                path=manifest.parent / row["path"],
                duration=float(row["duration_s"]),
                speaker=row["speaker"],
                text=row.get("text", ""),
                dataset=manifest.parent.name,
                subset=row.get("subset") or evaluation_set(row["id"]),
            )
            for row in csv.DictReader(f, delimiter="\t")
        ]


def evaluation_set(utterance_id: str) -> str:
    """The id's words before the first one holding a digit: ls-test-other-1688-142285-0000 -> ls-test-other,
    cathy-arctic-a0021 -> cathy-arctic (the subsets of ../shared/data/speech/README.md)."""
    words = utterance_id.split("-")
    prefix = next((i for i, word in enumerate(words) if any(c.isdigit() for c in word)), len(words))
    return "-".join(words[: max(prefix, 1)])


def spread(utterances: list[Utterance], count: int) -> list[Utterance]:
    """`count` utterances (all, if the list holds no more) taken at even steps through the whole list, so that every
    source of a manifest shows up, the last rows' too."""
    n = len(utterances)
    return [utterances[i * n // count] for i in range(count)] if count < n else list(utterances)


def clips_by_set(
    utterances: list[Utterance], max_seconds: float = DEFAULT_MAX_SECONDS
) -> tuple[list[Clip], dict[str, str]]:
    """The utterances' clips, and each clip's evaluation set by its hash (what pooled.weighting weighs)."""
    clips = [u.clip(max_seconds) for u in utterances]
    return clips, {clip.hash: u.subset for clip, u in zip(clips, utterances, strict=True)}


def heldout_ids() -> frozenset[str]:
    """The clips of train-speech-2 that drafts never train on, kept to choose training settings: 20 speechocean762
    clips of 20 speakers, 20 VCTK clips of 4 speakers and the 7 ARCTIC clips."""
    return frozenset(HELDOUT_IDS.read_text().split())


def load_utterances(data: Path | str) -> list[Utterance]:
    """A manifest's rows, several manifests' (comma-separated) one after the other, or with `heldout` the held-out
    clips of train-speech-2."""
    utterances, names = [], str(data).split(",")
    for name in names:
        if name == "heldout":
            held = heldout_ids()
            utterances += [u for u in load_manifest(TRAIN_SPEECH_2_DIR) if u.id in held]
        else:
            utterances += load_manifest(Path(name))
    repeated = sorted(id for id, n in Counter(u.id for u in utterances).items() if n > 1)
    if len(names) > 1 and repeated:  # a single manifest's repeats are its reader's to refuse
        raise ValueError(f"{data}: the manifests list {', '.join(repeated[:3])} more than once")
    return utterances
