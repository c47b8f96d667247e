"""The pipeline: one chain from clip to trace, long clips in windows, reference frames made once."""

import dataclasses
from dataclasses import replace

import numpy as np
import pytest

from specasr import pipeline as pipeline_module
from specasr.audio import SAMPLE_RATE, AudioTooLongError, Clip, split_windows
from specasr.pipeline import Pipeline
from specasr.store import Store
from specasr.trace import Settings


def long_clip(speech, seconds: float) -> Clip:
    """Real utterances one after another, with half a second of faint noise between them."""
    rng = np.random.default_rng(0)
    pieces, total = [], 0
    for utterance in speech[::7]:
        gap = rng.normal(0, 1e-3, SAMPLE_RATE // 2).astype(np.float32)
        audio = utterance.clip().audio
        pieces += [audio, gap]
        total += len(audio) + len(gap)
        if total >= seconds * SAMPLE_RATE:
            break
    return Clip("long", np.concatenate(pieces)[: int(seconds * SAMPLE_RATE)])


def test_windows_cover_the_clip_cut_at_quiet_frames_within_the_last_seconds():
    rng = np.random.default_rng(1)
    audio = rng.normal(0, 0.3, 70 * SAMPLE_RATE).astype(np.float32)
    quiet = [27 * SAMPLE_RATE, 53 * SAMPLE_RATE]
    for start in quiet:
        audio[start : start + SAMPLE_RATE // 5] = 0
    windows = split_windows(audio, 30 * SAMPLE_RATE, 320)
    assert [w[0] for w in windows] == [0, *[w[1] for w in windows[:-1]]] and windows[-1][1] == len(audio)
    assert all(end - start <= 30 * SAMPLE_RATE and start % 320 == 0 for start, end in windows)
    for (_, cut), silent in zip(windows, quiet, strict=False):
        assert silent <= cut <= silent + SAMPLE_RATE // 5
    assert split_windows(audio[: 10 * SAMPLE_RATE], 30 * SAMPLE_RATE, 320) == [(0, 10 * SAMPLE_RATE)]


def test_a_70_s_clip_decodes_in_three_segments_as_each_window_alone(pipeline, speech):
    clip = long_clip(speech, 70)
    settings = Settings(draft="whisper-tiny.en/anchordraft", window="correct", reference="always")
    trace = pipeline.decode(clip, settings)

    target = pipeline.target(settings)
    windows = split_windows(clip.audio, target.window_samples, target.cut_samples)
    alone = [pipeline.decode(Clip(f"w{i}", clip.audio[a:b]), settings) for i, (a, b) in enumerate(windows)]
    assert len(trace.segments) == len(windows) == 3
    assert trace.text == " ".join(w.text for w in alone)
    assert trace.tokens == [t for w in alone for t in w.tokens]
    for segment, (start, _), window in zip(trace.segments, windows, alone, strict=True):
        assert segment.start_frame == start // 320 and segment.tokens == len(window.tokens)
        first, last = segment.start_frame, segment.start_frame + segment.valid_frames
        frames = trace.reference_frames[segment.first_token : segment.first_token + segment.tokens]
        assert frames == [None if f is None else f + first for f in window.reference_frames]
        verified = trace.verified[segment.first_token : segment.first_token + segment.tokens]
        assert all(first <= p < last for v in verified for p in v.verify_peaks)
    for step in trace.steps:
        segment = trace.segments[trace.rounds[step.round].segment]
        assert segment.start_frame <= step.draft_peak < segment.start_frame + segment.valid_frames
    assert len(trace.rounds) == sum(len(w.rounds) for w in alone)
    assert [r.segment for r in trace.rounds] == [i for i, w in enumerate(alone) for _ in w.rounds]


def test_reference_frames_do_not_depend_on_what_was_aligned_before(speech):
    clip = long_clip(speech, 70)
    settings = Settings(reference="always")
    target = Pipeline().target(settings)
    start, end = split_windows(clip.audio, target.window_samples, target.cut_samples)[0]
    first = Clip("first window", clip.audio[start:end])
    fresh = Pipeline().reference(first, settings)
    seasoned = Pipeline()
    seasoned.reference(clip, settings)  # pocketsphinx's noise estimate would carry over from the other windows
    assert seasoned.reference(first, settings) == fresh


def test_encoder_once_and_reference_only_when_needed_and_only_once(sample_clips, monkeypatch):
    pipeline = Pipeline()
    target = pipeline.target(Settings())
    calls = {"encode": 0, "greedy": 0, "align": 0}

    def counted(name, function):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return function(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(target, "encode", counted("encode", target.encode))
    monkeypatch.setattr(pipeline_module, "greedy", counted("greedy", pipeline_module.greedy))
    aligner = pipeline.aligner("pocketsphinx")
    monkeypatch.setattr(aligner, "align", counted("align", aligner.align))
    clip = sample_clips[0].clip()

    pipeline.decode(clip, Settings(draft="random", window="unrestricted"))
    assert calls == {"encode": 1, "greedy": 0, "align": 0}
    trace = pipeline.decode(clip, Settings(draft="random", window="correct"))
    assert calls == {"encode": 2, "greedy": 1, "align": 1}
    assert trace.reference_source == "pocketsphinx" and len(trace.reference_frames) == len(trace.tokens)
    assert trace.timings.reference > 0
    again = pipeline.decode(clip, Settings(draft="random", window="shift", k=2))
    assert calls == {"encode": 3, "greedy": 1, "align": 1}  # the clip's reference frames are reused
    assert again.reference_frames == trace.reference_frames and again.timings.reference < trace.timings.reference


def test_reference_frames_are_reused_from_the_store_by_a_fresh_pipeline(sample_clips, tmp_path, monkeypatch):
    store = Store(tmp_path / "runs.duckdb")
    clip, settings = sample_clips[0].clip(), Settings(draft="random", window="correct")
    first = Pipeline(store).decode(clip, settings)
    later = Pipeline(store)  # a fresh pipeline knows nothing in memory
    monkeypatch.setattr(pipeline_module, "greedy", lambda *a, **k: pytest.fail("greedy ran again"))
    assert later.reference(clip, settings).frames == first.reference_frames
    assert later.decode(clip, replace(settings, draft="random-no-audio")).reference_source == "pocketsphinx"


def test_a_trace_is_complete_when_built_and_cannot_be_patched(pipeline, sample_clips):
    utterance = sample_clips[0]
    trace = pipeline.decode(utterance.clip(), Settings(draft="whisper-tiny.en/control", window="runtime"))
    assert trace.settings.runtime_layer == pipeline.target(trace.settings).runtime_layer
    assert trace.settings.draft_dtype == "float32" and trace.draft_name.startswith("whisper-tiny.en/control@")
    assert len(trace.draft_hash) == 64 and trace.code.package_version
    assert trace.code.git_commit is None or len(trace.code.git_commit) == 40
    assert (trace.clip_id, trace.dataset, trace.reference_text) == (utterance.id, "speech", utterance.text)
    assert trace.clip_seconds == pytest.approx(utterance.duration, abs=0.01) and len(trace.clip_hash) == 16
    assert trace.reference_frames is None and trace.reference_source is None  # the runtime window needs none
    phases = trace.phase_seconds()
    assert phases["draft"] + phases["verify"] <= phases["decode"] and phases["total"] == trace.timings.total
    with pytest.raises(dataclasses.FrozenInstanceError):
        trace.text = "patched"


def test_greedy_settings_carry_no_draft_settings(pipeline, sample_clips):
    trace = pipeline.decode(sample_clips[0].clip(), Settings(k=8, window="shift", reference="never"))
    assert (trace.settings.k, trace.settings.window, trace.draft_name, trace.rounds) == (0, "unrestricted", "none", [])
    assert [v.position for v in trace.verified] == list(range(len(trace.tokens)))


def test_settings_and_clips_that_cannot_be_decoded_are_clear_errors(pipeline, sample_clips, tmp_path):
    with pytest.raises(ValueError, match="unknown window"):
        Settings(draft="random", window="sideways")
    with pytest.raises(ValueError, match="K must be between 1 and 64"):
        Settings(draft="random", k=0)
    clip = sample_clips[0].clip()
    with pytest.raises(AudioTooLongError, match="over the 2 s limit"):
        pipeline.decode(clip, Settings(max_seconds=2))
    with pytest.raises(ValueError, match="needs reference frames"):
        pipeline.decode(clip, Settings(draft="random", window="pointer", reference="never"))
    frames = tmp_path / "frames.json"
    frames.write_text('{"not": "a list"}')
    with pytest.raises(ValueError, match="JSON list of frame numbers"):
        pipeline.decode(clip, Settings(draft="random", window="correct", reference=str(frames)))


def test_a_decode_reports_each_round_as_it_ends(pipeline, sample_clips):
    seen = []
    trace = pipeline.decode(sample_clips[0].clip(), Settings(draft="random", k=2, verify_peaks=False), seen.append)
    assert seen == trace.rounds and len(seen) > 1
