"""A set of clips from a manifest, decoded under one Settings clip by clip, and its per-clip table.

Every clip is stored as a run of its own (command "dataset") as soon as it is decoded, so a decode that is stopped
loses at most the clip in progress, and decoding the set again skips every clip the store already holds under the
same settings, whichever set decoded it. Where the store cannot take a clip (busy, read-only, a full disk), that clip
and the rest are kept in memory instead. Decodes ask for reference frames so that anchor errors exist; a clip the
aligner cannot place is decoded without them. The table's metrics come from the stored traces.
"""

import csv
import hashlib
import io
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from specasr.align import AlignmentError
from specasr.audio import AudioError, Clip
from specasr.cache import atomic_directory
from specasr.dataset import Utterance, load_utterances
from specasr.metrics import acceptance, word_error_rate
from specasr.pipeline import Pipeline
from specasr.store import Store, StoreError
from specasr.trace import REFERENCE_WINDOWS, Round, Settings, Trace

COMMAND = "dataset"
COLUMNS = ["clip_id", "set", "speaker", "duration_s", "wer", "a1", "a2c", "L", "anchor_error_ms", "run_id"]
MANIFEST_COLUMNS = ("id", "path", "duration_s", "speaker")  # and text, for the word error rate


class ClipSetError(ValueError):
    """A manifest or an upload that cannot be read as a set of clips; the message says why."""


@dataclass
class SetDecode:
    """What decoding a set did: every clip's run, new or reused, the decodes the store could not take, and why some
    clips lack anchor errors or a run."""

    runs: dict[str, str] = field(default_factory=dict)  # clip id -> run id
    decoded: int = 0  # decoded and stored
    reused: int = 0
    problems: dict[str, str] = field(default_factory=dict)  # clip id -> what went wrong
    unstored: dict[str, Trace] = field(default_factory=dict)  # clip id -> a decode the store could not take
    store_error: str | None = None  # why it could not


def read_manifest(path: Path | str) -> list[Utterance]:
    """A manifest's clips, every one with its audio file, or ClipSetError saying what is wrong."""
    try:
        utterances = load_utterances(path)
    except FileNotFoundError as error:
        raise ClipSetError(f"{error}: give a folder holding a manifest.tsv, or the manifest itself") from error
    except KeyError as error:
        raise ClipSetError(f"the manifest has no {error} column; it needs {', '.join(MANIFEST_COLUMNS)}") from error
    except (ValueError, csv.Error, UnicodeDecodeError) as error:
        raise ClipSetError(f"cannot read the manifest: {error}") from error
    if not utterances:
        raise ClipSetError("the manifest lists no clips")
    repeated = sorted(name for name, n in Counter(u.id for u in utterances).items() if n > 1)
    if repeated:
        raise ClipSetError(f"clip ids must be unique; repeated: {', '.join(repeated[:5])}")
    missing = [str(u.path) for u in utterances if not u.path.is_file()]
    if missing:
        raise ClipSetError(f"{len(missing)} of {len(utterances)} audio files are missing: {', '.join(missing[:5])}")
    return utterances


def save_upload(files: Mapping[str, bytes], root: Path) -> Path:
    """Write an uploaded manifest (.tsv) and its audio files into a folder named by their content, under `root`,
    each audio file where the manifest's path puts it (uploads keep only file names). Returns the folder."""
    manifests = [name for name in files if name.endswith(".tsv")]
    if len(manifests) != 1:
        raise ClipSetError(f"upload one manifest (.tsv) with its audio files; got {len(manifests)} .tsv files")
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
    folder = root / digest.hexdigest()[:16]
    if (folder / "manifest.tsv").is_file():
        return folder
    paths = _audio_paths(files[manifests[0]])
    audio = {Path(name).name: data for name, data in files.items() if name != manifests[0]}
    missing = [path for path in paths if Path(path).name not in audio]
    if missing:
        listed = f"{', '.join(missing[:5])} ({len(missing)} of {len(paths)})"
        raise ClipSetError(f"audio files the manifest names were not uploaded: {listed}")
    with atomic_directory(folder) as scratch:
        for path in paths:
            place = scratch / path
            place.parent.mkdir(parents=True, exist_ok=True)
            place.write_bytes(audio[Path(path).name])
        (scratch / "manifest.tsv").write_bytes(files[manifests[0]])
    return folder


def _audio_paths(manifest: bytes) -> list[str]:
    """The manifest's audio paths; refused where one would leave the manifest's folder."""
    try:
        rows = list(csv.DictReader(io.StringIO(manifest.decode()), delimiter="\t"))
        paths = [row["path"] for row in rows]
    except (UnicodeDecodeError, csv.Error) as error:
        raise ClipSetError(f"cannot read the manifest: {error}") from error
    except KeyError as error:
        raise ClipSetError(f"the manifest has no {error} column; it needs {', '.join(MANIFEST_COLUMNS)}") from error
    outside = [p for p in paths if not p or Path(p).is_absolute() or ".." in Path(p).parts]
    if outside:
        raise ClipSetError(f"audio paths must lie inside the manifest's folder: {', '.join(outside[:5])}")
    return paths


def dataset_settings(settings: Settings) -> Settings:
    """The sidebar's settings as a set is decoded: with reference frames (anchor errors), without attention rows."""
    return replace(settings, reference="always", keep_attention=False)


def stored_runs(store: Store, settings: Settings) -> dict[str, str]:
    """Clip hash -> the latest dataset run that decoded the clip under `settings` (as the pipeline resolves them);
    a clip decoded without reference frames, because the aligner could not place its words, counts too."""
    held = {}
    for run in store.decoded(COMMAND):
        if replace(run.settings, reference=settings.reference) == settings:
            held |= dict.fromkeys((clip_hash for clip_hash, _ in run.decoded), run.run_id)
    return held


def decode_set(
    pipeline: Pipeline,
    store: Store,
    utterances: list[Utterance],
    settings: Settings,
    on_clip: Callable[[int, Utterance], None] | None = None,
    keep_audio: bool = False,
    on_round: Callable[[Round], None] | None = None,
) -> SetDecode:
    """Decode every clip the store does not hold under these settings, storing each as it finishes.

    on_clip: called with each clip's index before it is read (a progress report, and the place a caller can stop).
    keep_audio: store each clip's waveform too, for clips whose files may not last (uploads).
    on_round: called with every round of every decode as it ends (a progress report).
    A clip that cannot be read or decoded is left out, with its reason in `problems`. After the first write the store
    refuses, the rest are not offered to it (a busy store would make each wait): they go to `unstored`.
    """
    settings = dataset_settings(settings)
    held = stored_runs(store, pipeline.resolved(settings))
    outcome = SetDecode()
    for index, utterance in enumerate(utterances):
        if on_clip is not None:
            on_clip(index, utterance)
        try:
            clip = utterance.clip()
            if clip.hash in held:
                outcome.runs[utterance.id] = held[clip.hash]
                outcome.reused += 1
                continue
            trace = _decode(pipeline, clip, settings, outcome.problems, on_round)
        except (AudioError, AlignmentError) as error:
            outcome.problems[utterance.id] = f"not decoded: {error}"
            continue
        if outcome.store_error is None:
            try:
                audio = {clip.hash: clip.audio} if keep_audio else None
                held[clip.hash] = outcome.runs[utterance.id] = store.write_run([trace], COMMAND, audio=audio)
                outcome.decoded += 1
            except StoreError as error:
                outcome.store_error = str(error)
        if utterance.id not in outcome.runs:
            outcome.unstored[utterance.id] = trace
    return outcome


def _decode(
    pipeline: Pipeline,
    clip: Clip,
    settings: Settings,
    problems: dict[str, str],
    on_round: Callable[[Round], None] | None,
) -> Trace:
    """Decode with reference frames; where the aligner cannot place the words, without them (unless the window
    is centred from them), noting why."""
    try:
        return pipeline.decode(clip, settings, on_round)
    except AlignmentError as error:
        if settings.window in REFERENCE_WINDOWS:
            raise
        problems[clip.id] = f"no reference frames, so no anchor error: {error}"
        return pipeline.decode(clip, replace(settings, reference="never"), on_round)


def clip_metrics(trace: Trace) -> dict:
    """One decode's row of the table: its length, WER, acceptance (none for greedy) and median anchor error."""
    row = {"duration_s": trace.clip_seconds, "wer": _word_error_rate(trace), "a1": None, "a2c": None, "L": None}
    if trace.rounds:
        accepted = acceptance([trace])
        row |= {"a1": accepted.a1, "a2c": accepted.a2c, "L": accepted.L}
    return row | {"anchor_error_ms": median_anchor_error_ms(trace)}


def _word_error_rate(trace: Trace) -> float | None:
    try:
        return word_error_rate([trace.reference_text], [trace.text])
    except ValueError:  # the clip has no reference words
        return None


def median_anchor_error_ms(trace: Trace) -> float | None:
    """Median |draft attention peak - reference frame| over the draft steps where both are known, in ms."""
    known = [s for s in trace.spine if s.draft_peak is not None and s.reference_frame is not None]
    errors = [abs(s.draft_peak - s.reference_frame) for s in known]
    return float(np.median(errors)) * trace.frame_seconds * 1000 if errors else None


def clip_table(utterances: list[Utterance], rows: Mapping[str, dict]) -> pd.DataFrame:
    """One row per decoded clip, from its clip_metrics and run id (clip id -> both; a run id of None: not stored),
    worst first: highest WER, then lowest L."""
    decoded = [u for u in utterances if u.id in rows]
    records = [{"clip_id": u.id, "set": u.subset, "speaker": u.speaker, **rows[u.id]} for u in decoded]
    table = pd.DataFrame(records, columns=COLUMNS).astype(dict.fromkeys(COLUMNS[3:9], float))
    table = table.sort_values(["wer", "L"], ascending=[False, True], na_position="last", kind="stable")
    return table.reset_index(drop=True)
