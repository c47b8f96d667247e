"""Sets of clips: manifests and uploads read with clear errors, decoding that resumes from the store, and the per-clip
table equal to a hand computation."""

import io
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import soundfile
from test_experiments import hand_trace, restarts

from specasr import clipset
from specasr.align import AlignmentError
from specasr.audio import SAMPLE_RATE, Clip
from specasr.clipset import COLUMNS, COMMAND, ClipSetError
from specasr.dataset import Utterance
from specasr.store import Store, StoreError
from specasr.trace import DraftStep, Settings, Trace

RANDOM = Settings(draft="random", draft_dtype="float16", k=2)
HEADER = "id\tpath\tduration_s\tspeaker\ttext\n"


def tone(index: int) -> bytes:
    """Half a second of a tone of its own pitch, as WAV bytes: every clip has audio of its own."""
    samples = 0.1 * np.sin(2 * np.pi * (200 + 50 * index) * np.arange(SAMPLE_RATE // 2) / SAMPLE_RATE)
    buffer = io.BytesIO()
    soundfile.write(buffer, samples.astype(np.float32), SAMPLE_RATE, format="WAV")
    return buffer.getvalue()


def manifest(ids: list[str], folder: str = "audio") -> str:
    return HEADER + "".join(f"{i}\t{folder}/{i}.wav\t0.5\tspeaker-{i[0]}\tthe words of {i}\n" for i in ids)


def tone_folder(root: Path, ids: list[str]) -> Path:
    (root / "audio").mkdir(parents=True)
    for index, clip_id in enumerate(ids):
        (root / "audio" / f"{clip_id}.wav").write_bytes(tone(index))
    (root / "manifest.tsv").write_text(manifest(ids))
    return root


class FakePipeline:
    """Decodes any clip at once into a trace of two rounds; clips in `unalignable` have no reference frames."""

    def __init__(self, unalignable: tuple[str, ...] = ()):
        self.unalignable = unalignable
        self.decoded: list[tuple[str, Settings]] = []

    def resolved(self, settings: Settings) -> Settings:
        return settings

    def decode(self, clip: Clip, settings: Settings, on_round=None) -> Trace:
        if settings.reference == "always" and clip.id in self.unalignable:
            raise AlignmentError("no words to align")
        self.decoded.append((clip.id, settings))
        trace = hand_trace(settings, clip.id, [1, 0], 1.0)
        return replace(trace, clip_hash=clip.hash, clip_seconds=clip.seconds, reference_text=clip.text, text="words")


class Stopped(Exception):
    """Streamlit stopping the script run, as another control or the Stop button does."""


def test_a_stopped_set_resumes_without_decoding_a_stored_clip_again(tmp_path):
    utterances = clipset.read_manifest(tone_folder(tmp_path / "set", ["a1", "b2", "c3", "d4"]))
    store, pipeline = Store(tmp_path / "runs.duckdb"), FakePipeline()

    def stop_at_third(index: int, utterance: Utterance) -> None:
        if index == 2:
            raise Stopped

    with pytest.raises(Stopped):
        clipset.decode_set(pipeline, store, utterances, RANDOM, stop_at_third)
    assert [clip_id for clip_id, _ in pipeline.decoded] == ["a1", "b2"]
    assert len(store.runs()) == 2  # each clip stored as it finished

    resumed = clipset.decode_set(pipeline, store, utterances, RANDOM)
    assert (resumed.decoded, resumed.reused) == (2, 2) and not resumed.problems
    assert [clip_id for clip_id, _ in pipeline.decoded] == ["a1", "b2", "c3", "d4"]
    assert set(resumed.runs) == {"a1", "b2", "c3", "d4"} and len(set(resumed.runs.values())) == 4
    again = clipset.decode_set(pipeline, store, utterances, RANDOM)
    assert (again.decoded, again.reused, again.runs) == (0, 4, resumed.runs)

    other = clipset.decode_set(pipeline, store, utterances[:1], replace(RANDOM, k=3))  # other settings: decoded anew
    assert (other.decoded, other.reused) == (1, 0)
    runs = store.runs()
    assert len(runs) == 5 and set(runs.command) == {COMMAND}
    asked = {settings for _, settings in pipeline.decoded}
    assert {(s.reference, s.keep_attention) for s in asked} == {("always", False)}  # frames for anchor errors


def test_a_clip_the_aligner_cannot_place_is_decoded_without_frames_and_reused(tmp_path):
    utterances = clipset.read_manifest(tone_folder(tmp_path / "set", ["a1", "b2"]))
    store, pipeline = Store(tmp_path / "runs.duckdb"), FakePipeline(unalignable=("b2",))
    outcome = clipset.decode_set(pipeline, store, utterances, RANDOM)
    assert outcome.decoded == 2 and outcome.problems["b2"].startswith("no reference frames, so no anchor error")
    assert [s.reference for _, s in pipeline.decoded] == ["always", "never"]
    assert clipset.decode_set(pipeline, store, utterances, RANDOM).reused == 2  # its run counts as these settings

    centred = replace(RANDOM, window="correct")  # a window centred from the frames cannot do without them
    outcome = clipset.decode_set(pipeline, store, utterances, centred)
    assert outcome.decoded == 1 and set(outcome.runs) == {"a1"}
    assert outcome.problems["b2"] == "not decoded: no words to align"


def test_uploaded_clips_keep_their_audio_in_the_store(tmp_path):
    utterances = clipset.read_manifest(tone_folder(tmp_path / "set", ["a1"]))
    store = Store(tmp_path / "runs.duckdb")
    clipset.decode_set(FakePipeline(), store, utterances, RANDOM, keep_audio=True)
    clip = utterances[0].clip()
    assert np.array_equal(store.audio(clip.hash), clip.audio)


def test_a_clip_that_is_not_audio_is_left_out_with_its_reason(tmp_path):
    folder = tone_folder(tmp_path / "set", ["a1", "b2"])
    (folder / "audio" / "b2.wav").write_text("not audio")
    outcome = clipset.decode_set(FakePipeline(), Store(tmp_path / "runs.duckdb"), clipset.read_manifest(folder), RANDOM)
    assert set(outcome.runs) == {"a1"} and outcome.problems["b2"].startswith("not decoded: cannot decode")


def test_decodes_the_store_cannot_take_are_kept_and_writing_stops_at_the_first_failure(tmp_path, monkeypatch):
    utterances = clipset.read_manifest(tone_folder(tmp_path / "set", ["a1", "b2", "c3"]))
    store, attempts = Store(tmp_path / "runs.duckdb"), []

    def full_disk(*args, **kwargs):
        attempts.append(args)
        raise StoreError("runs.duckdb is on a full disk")

    monkeypatch.setattr(store, "write_run", full_disk)
    outcome = clipset.decode_set(FakePipeline(), store, utterances, RANDOM)
    assert (outcome.decoded, outcome.runs, outcome.store_error) == (0, {}, "runs.duckdb is on a full disk")
    assert {clip_id: trace.clip_id for clip_id, trace in outcome.unstored.items()} == {c: c for c in ["a1", "b2", "c3"]}
    assert len(attempts) == 1 and not outcome.problems


def test_clip_metrics_equal_a_hand_computation():
    settings = replace(RANDOM, reference="always")
    steps = [
        *restarts([2, 0, 1], [2, 0, 30]),
        DraftStep(0, 2, 7, True, 50, None, None, node=1, parent=0),
    ]  # no frame: left out
    trace = replace(
        hand_trace(settings, "u", [2, 0, 1], 1.0, steps=steps),
        clip_seconds=2.5,
        reference_text="The cat sat.",
        text="the cat sat down",
    )
    row = clipset.clip_metrics(trace)
    # s1 = 2/3 of rounds, s2 = 1/3; a2c = s2 / s1; L = s1 + s2; errors 2, 0 and 30 frames of 20 ms
    expected = {"duration_s": 2.5, "wer": 1 / 3, "a1": 2 / 3, "a2c": 0.5, "L": 1.0, "anchor_error_ms": 40.0}
    assert row == pytest.approx(expected)
    greedy = clipset.clip_metrics(replace(trace, rounds=[], steps=[], reference_text=""))
    assert greedy == {"duration_s": 2.5, "wer": None, "a1": None, "a2c": None, "L": None, "anchor_error_ms": None}


def test_the_table_lists_decoded_clips_worst_first():
    utterances = [Utterance(i, Path(f"{i}.wav"), 1.0, f"s-{i}", "", "set", f"set-{i[0]}") for i in "abcde"]
    values = {  # e is not decoded; d's decode was not stored
        "a": [1.0, 0.5, 0.9, 0.8, 2.0, 40.0, "ra"],
        "b": [2.0, None, 0.1, None, 0.1, None, "rb"],
        "c": [3.0, 0.5, 0.5, 0.5, 1.0, 60.0, "rc"],
        "d": [4.0, 0.1, 0.2, 0.2, 0.3, 20.0, None],
    }
    rows = {clip_id: dict(zip(COLUMNS[3:], row, strict=True)) for clip_id, row in values.items()}
    table = clipset.clip_table(utterances, rows)
    assert list(table.columns) == COLUMNS
    assert table.clip_id.tolist() == ["c", "a", "d", "b"]  # WER down, then L up; no WER last
    assert table.run_id.fillna("not stored").tolist() == ["rc", "ra", "not stored", "rb"]
    assert table.iloc[0][["set", "speaker", "duration_s", "anchor_error_ms"]].tolist() == ["set-c", "s-c", 3.0, 60.0]
    assert np.isnan(table.set_index("clip_id").loc["b", "wer"])


def test_a_real_set_decodes_with_anchor_errors_and_its_table_matches_the_store(sample_clips, pipeline, tmp_path):
    store = Store(tmp_path / "runs.duckdb")
    chosen = sample_clips[:2]  # two evaluation sets
    outcome = clipset.decode_set(pipeline, store, chosen, RANDOM)
    assert outcome.decoded == 2 and not outcome.problems
    rows = {c: clipset.clip_metrics(store.traces(r)[0]) | {"run_id": r} for c, r in outcome.runs.items()}
    table = clipset.clip_table(chosen, rows).set_index("run_id")
    stored = store.runs().set_index("run_id")
    assert table.wer.to_dict() == pytest.approx(stored.median_wer.loc[table.index].to_dict())  # the store's WER
    assert table.anchor_error_ms.notna().all() and table.L.notna().all()
    assert set(table.clip_id) == {u.id for u in chosen} and set(table["set"]) == {u.subset for u in chosen}


def test_a_bad_manifest_says_what_is_wrong(tmp_path):
    with pytest.raises(ClipSetError, match="no manifest"):
        clipset.read_manifest(tmp_path)
    (tmp_path / "manifest.tsv").write_text("id\tfile\nx\tx.wav\n")
    with pytest.raises(ClipSetError, match="no 'path' column; it needs id, path, duration_s, speaker"):
        clipset.read_manifest(tmp_path)
    (tmp_path / "manifest.tsv").write_text(HEADER)
    with pytest.raises(ClipSetError, match="lists no clips"):
        clipset.read_manifest(tmp_path)
    (tmp_path / "manifest.tsv").write_text(manifest(["a1", "b2"]))
    with pytest.raises(ClipSetError, match="2 of 2 audio files are missing"):
        clipset.read_manifest(tmp_path)
    (tmp_path / "manifest.tsv").write_text(manifest(["a1", "a1"]))
    with pytest.raises(ClipSetError, match="clip ids must be unique; repeated: a1"):
        clipset.read_manifest(tmp_path)


def test_an_upload_is_saved_where_its_manifest_puts_each_file(tmp_path):
    files = {"manifest.tsv": manifest(["a1", "b2"]).encode(), "a1.wav": tone(0), "b2.wav": tone(1)}
    folder = clipset.save_upload(files, tmp_path)
    assert (folder / "audio" / "b2.wav").read_bytes() == tone(1)
    assert [u.id for u in clipset.read_manifest(folder)] == ["a1", "b2"]
    assert clipset.save_upload(files, tmp_path) == folder  # the same upload, the same folder

    with pytest.raises(ClipSetError, match=r"the manifest names were not uploaded: audio/b2.wav \(1 of 2\)"):
        clipset.save_upload({k: v for k, v in files.items() if k != "b2.wav"}, tmp_path)
    with pytest.raises(ClipSetError, match="upload one manifest"):
        clipset.save_upload({"a1.wav": tone(0)}, tmp_path)
    with pytest.raises(ClipSetError, match=r"inside the manifest's folder: \.\./a1\.wav"):
        clipset.save_upload({"m.tsv": manifest(["a1"], "..").encode(), "a1.wav": tone(0)}, tmp_path)
    assert len(list(tmp_path.iterdir())) == 1  # a refused upload leaves nothing behind
