import json
import subprocess
import sys

import pytest
import soundfile

from specasr.cli import main
from specasr.metrics import acceptance, passes_per_round
from specasr.store import Store, default_db_path


def test_transcribe_json_has_the_contract_fields(capsys, sample_clips):
    assert main(["transcribe", str(sample_clips[0].path), "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["target"] == "whisper-tiny.en"
    assert (record["device"], record["dtype"]) == ("cpu", "float32")
    assert record["text"] and all(isinstance(t, int) for t in record["tokens"])
    assert set(record["timings"]) >= {"features", "encoder", "decode", "total"}
    assert record["timings"]["total"] >= record["timings"]["decode"] > 0


def test_transcribe_plain_prints_the_text(capsys, sample_clips):
    assert main(["transcribe", str(sample_clips[0].path)]) == 0
    assert "cooler judgment" in capsys.readouterr().out


def test_eval_prints_word_error_rate_as_json(capsys, speech):
    assert main(["eval", "--limit", "2", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["target"] == "whisper-tiny.en" and record["utterances"] == 2
    assert 0 <= record["wer"] < 1 and record["seconds"] > 0
    assert record["audio_seconds"] == pytest.approx(sum(u.duration for u in speech[:2]))


def test_user_mistakes_exit_non_zero_without_traceback(tmp_path):
    not_audio = tmp_path / "notes.wav"
    not_audio.write_text("this is not a wave file")
    for args in (["transcribe", str(not_audio)], ["transcribe", str(tmp_path / "missing.wav")]):
        done = subprocess.run([sys.executable, "-m", "specasr", *args], capture_output=True, text=True)
        assert done.returncode == 2
        assert done.stderr.startswith("error:") and "Traceback" not in done.stderr
        assert done.stdout == ""


def test_a_clip_over_the_length_limit_says_how_to_raise_it(capsys, sample_clips):
    assert main(["transcribe", str(sample_clips[0].path), "--max-seconds", "1"]) == 2
    assert capsys.readouterr().err.endswith("s limit; raise it with --max-seconds, or split the clip\n")


def test_unknown_target_is_a_user_error(capsys, sample_clips):
    assert main(["transcribe", str(sample_clips[0].path), "--target", "whisper-huge"]) == 2
    assert "no target 'whisper-huge': it is not a local folder" in capsys.readouterr().err


def test_decode_json_has_rounds_metrics_and_timings(capsys, sample_clips):
    assert main(["decode", str(sample_clips[0].path), "--draft", "random", "--k", "3", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    greedy_main = main(["transcribe", str(sample_clips[0].path), "--json"])
    greedy = json.loads(capsys.readouterr().out)
    assert greedy_main == 0 and record["tokens"] == greedy["tokens"] and record["text"] == greedy["text"]
    assert {"proposed", "accepted", "draft_peaks", "verify_peaks"} <= set(record["rounds"][0])
    assert all(1 <= len(r["proposed"]) <= 3 and len(r["draft_peaks"]) == len(r["proposed"]) for r in record["rounds"])
    assert {"a1", "a2c", "s", "L", "tokens_per_round"} <= set(record["metrics"])
    assert record["metrics"]["s"][0] == 1.0 and len(record["metrics"]["s"]) == 4
    assert {"features", "encoder", "draft", "verify", "total"} <= set(record["timings"])
    assert record["dtype"] == record["draft_dtype"] == "float32"


def test_decode_with_a_float16_draft_keeps_the_greedy_tokens(capsys, sample_clips):
    clip = str(sample_clips[0].path)
    assert main(["decode", clip, "--draft", "whisper-tiny.en/control", "--draft-dtype", "float16", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert main(["transcribe", clip, "--json"]) == 0
    assert record["tokens"] == json.loads(capsys.readouterr().out)["tokens"]
    assert (record["dtype"], record["draft_dtype"]) == ("float32", "float16")


def test_decode_reference_file_errors_are_user_errors(capsys, sample_clips, tmp_path):
    clip = str(sample_clips[0].path)
    assert main(["decode", clip, "--window", "correct", "--reference", "never"]) == 2
    assert "needs reference frames" in capsys.readouterr().err
    bad = tmp_path / "frames.json"
    bad.write_text('{"frames": 3}')
    assert main(["decode", clip, "--window", "correct", "--reference", str(bad)]) == 2
    assert "JSON list of frame numbers" in capsys.readouterr().err
    long = tmp_path / "long.json"
    long.write_text(json.dumps([3 * i for i in range(40)]))
    assert main(["decode", clip, "--window", "correct", "--reference", str(long)]) == 2
    assert "holds 40 frames; the transcript has 11 tokens" in capsys.readouterr().err
    good = tmp_path / "good.json"
    good.write_text(json.dumps([3 * i for i in range(11)]))
    assert main(["decode", clip, "--window", "correct", "--reference", str(good)]) == 0
    assert "cooler judgment" in capsys.readouterr().out


def test_bench_prints_a_table_and_summary(capsys, speech):
    assert main(["bench", "--clips", "1", "--repeats", "1", "--k", "1,2", "--draft", "random"]) == 0
    out = capsys.readouterr().out
    for column in (
        "greedy compiled",  # beside the default greedy loop, which a CPU runs plainly
        "compile_s",
        "recompiles",
        "device_kernels_step",
        "plain_kernels_step",
        "random K=1",
        "random K=2",
        "baseline: greedy",
        "ms_per_token",
        "decode_speedup",
        "total_speedup",
        "rho",
        "a1",
        "a2c",
        "L",
        "tokens_per_second",
        "same_tokens_clips",
        "decode_speedup_low",
        "A/A check: greedy over its copy",
    ):
        assert column in out
    assert "warning: one timing repetition per clip" in out
    assert sum(line.startswith("stored ") for line in out.splitlines()) == 5  # greedy twice, its A/A copy, one per K


def test_bench_times_peers_beside_our_loops_as_json(capsys, speech):
    peers = "transformers,transformers-assisted"
    argv = ["bench", "--clips", "1", "--repeats", "1", "--k", "2", "--draft", "random", "--peers", peers]
    assert main([*argv, "--no-compile", "--json"]) == 0
    record = json.loads(capsys.readouterr().out, parse_constant=pytest.fail)  # no NaN in the JSON
    summary = {row["arm"]: row for row in record["summary"]}
    assert list(summary) == ["greedy", "transformers", "transformers-assisted", "random", "greedy (A/A)"]
    assert [row["phase"] for row in record["aa"]] == ["decode", "total"] and "aa_warning" in record
    assert record["timing"]["aa"]["reliable"] == (record["aa_warning"] is None)  # one clip, one repetition
    assert set(record["runs"]) == set(summary)
    assert summary["greedy"]["decode_speedup_pooled"] == 1.0 and summary["greedy"]["L"] is None
    for peer in ("transformers", "transformers-assisted"):  # the same weights and features as our greedy loop
        assert summary[peer]["same_tokens_clips"] == 1
    (assisted,) = Store(default_db_path()).traces(record["runs"]["transformers-assisted"])
    assert assisted.settings.assistant == "target-layers"
    random = summary["random"]
    assert random["same_tokens_clips"] == 1
    assert random["L"] == pytest.approx(acceptance(Store(default_db_path()).traces(record["runs"]["random"])).L)
    passes = passes_per_round(Store(default_db_path()).traces(record["runs"]["random"]))
    assert random["cost_model_speedup"] == pytest.approx((1 + random["L"]) / (random["v"] + passes * random["rho_w"]))
    assert random["verify_steps"] > 0 and 0 < random["outside_share"] < 1 and random["v"] > 0 and random["rho_w"] > 0
    accounted = random["cost_model_speedup"] * (1 - random["outside_share"])
    assert random["accounted_speedup"] == pytest.approx(accounted)
    assert [row["arm"] for row in record["clips"]] == list(summary)
    assert summary["greedy"]["baseline"] and not any(summary[arm]["baseline"] for arm in list(summary)[1:])
    with pytest.raises(SystemExit):
        main(["bench", "--peers", "whisper.cpp"])
    expected = "unknown whisper.cpp; choose from faster-whisper, transformers, transformers-assisted"
    assert expected in capsys.readouterr().err


def test_align_prints_word_times_and_one_frame_per_token(capsys, sample_clips):
    clip = str(sample_clips[0].path)
    assert main(["align", clip, "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert len(record["frames"]) == len(record["tokens"]) and record["frame_seconds"] == 0.02
    assert all(w["aligned"] for w in record["words"])
    frames = [f for f in record["frames"] if f is not None]
    assert frames == sorted(frames) and frames[0] >= 0 and frames[-1] < 3.4 / 0.02
    assert main(["align", clip, "--text", "I was about to do this"]) == 0
    assert "this" in capsys.readouterr().out


def test_align_with_an_unavailable_aligner_is_a_user_error(capsys, sample_clips):
    assert main(["align", str(sample_clips[0].path), "--aligner", "mms"]) == 2
    assert "torchaudio" in capsys.readouterr().err


def test_decode_with_automatic_reference_reports_anchor_error(capsys, sample_clips):
    assert main(["decode", str(sample_clips[0].path), "--window", "correct", "--reference", "auto", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    depths = record["metrics"]["anchor_error_by_depth"]
    assert [d["depth"] for d in depths] == [1, 2, 3, 4] and all(d["n"] > 0 for d in depths)
    steps = [(c, f) for r in record["rounds"] for c, f in zip(r["window_centres"], r["reference_frames"], strict=True)]
    assert all(centre == frame for centre, frame in steps if frame is not None)  # the correct window is centred
    assert sum(frame is not None for _, frame in steps) > len(steps) / 2


def test_train_rejects_malformed_taps_before_any_work(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["train", "--taps", "3,top"])
    assert stop.value.code == 2 and "layer numbers separated by commas" in capsys.readouterr().err


def test_a_decode_is_kept_and_listed_with_its_rounds_and_draft_steps(capsys, sample_clips, tmp_path):
    db = str(tmp_path / "runs.duckdb")
    clip = str(sample_clips[0].path)
    assert main(["decode", clip, "--draft", "whisper-tiny.en/anchordraft", "--k", "3", "--json", "--db", db]) == 0
    decoded = json.loads(capsys.readouterr().out)
    assert main(["runs", "list", "--json", "--db", db]) == 0
    (listed,) = json.loads(capsys.readouterr().out)
    assert listed["run_id"] == decoded["run_id"] and listed["clips"] == 1
    assert listed["rounds"] == len(decoded["rounds"]) > 0
    assert listed["draft_steps"] == decoded["draft_steps"] == sum(len(r["proposed"]) for r in decoded["rounds"])
    assert (listed["draft"], listed["k"], listed["window"]) == ("whisper-tiny.en/anchordraft", 3, "unrestricted")

    assert main(["runs", "show", decoded["run_id"], "--json", "--db", db]) == 0
    (shown,) = json.loads(capsys.readouterr().out)
    assert shown["tokens"] == decoded["tokens"] and len(shown["rounds"]) == len(decoded["rounds"])
    exported = tmp_path / "export"
    assert main(["runs", "export", decoded["run_id"], "--parquet", str(exported), "--db", db]) == 0
    assert main(["runs", "export", "--target", "whisper-base", "--parquet", str(exported), "--db", db]) == 2
    assert "no run" in capsys.readouterr().err
    assert main(["runs", "list", "--since", "2020-01-01", "--until", "2020-12-31", "--json", "--db", db]) == 0
    assert json.loads(capsys.readouterr().out) == []
    assert main(["runs", "delete", decoded["run_id"], "--db", db]) == 0
    assert len(list(exported.glob("*.parquet"))) >= 6 and "deleted run" in capsys.readouterr().out
    assert main(["runs", "list", "--json", "--db", db]) == 0
    assert json.loads(capsys.readouterr().out) == []
    assert main(["runs", "import", str(exported), "--db", db]) == 0
    assert capsys.readouterr().out == f"imported run {decoded['run_id']}\n"
    assert main(["runs", "list", "--json", "--db", db]) == 0
    assert [r["run_id"] for r in json.loads(capsys.readouterr().out)] == [decoded["run_id"]]


def test_no_store_keeps_nothing_and_a_broken_store_keeps_the_transcript(capsys, sample_clips, tmp_path):
    db = tmp_path / "runs.duckdb"
    clip = str(sample_clips[0].path)
    assert main(["decode", clip, "--no-store", "--db", str(db)]) == 0
    assert not db.exists()
    db.write_text("not a database")
    assert main(["decode", clip, "--db", str(db)]) == 1  # decoded and printed, not stored
    out, err = capsys.readouterr()
    assert "cooler judgment" in out
    refused = f"{db} is not a run store: it is not a DuckDB database; give another file"
    assert err.splitlines()[-1] == f"specasr: result not stored in {db}: {refused}"
    assert db.read_text() == "not a database"


def test_train_refuses_an_anchor_weight_for_a_draft_without_attention(capsys):
    assert main(["train", "--variant", "no-audio", "--anchor-weight", "0.1"]) == 2
    assert "0 for no-audio" in capsys.readouterr().err


def test_profile_prints_one_row_per_pass(capsys, sample_clips):
    argv = ["profile", str(sample_clips[0].path), "--draft", "random", "--k", "3", "--repeats", "2", "--json"]
    assert main(argv) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [row["pass"] for row in rows] == ["target step (1 row)", "verification (4 rows)", "draft step (1 row)"]
    assert rows[1]["target_steps"] > 0 and rows[0]["lm head"] > 0


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--device", "tpu"], "--device: unknown device 'tpu'; use cpu, cuda or cuda:N"),
        (["--device", "meta"], "--device: specasr decodes on cpu or cuda, not meta"),
        (["--device", "mps"], "--device: specasr decodes on cpu or cuda, not mps"),
        (["--half-width-ms", "nan"], "--half-width-ms: expected a number >= 0, got 'nan'"),
        (["--half-width-ms", "-5"], "--half-width-ms: expected a number >= 0, got '-5'"),
        (["--max-seconds", "-1"], "--max-seconds: expected a number > 0, got '-1'"),
        (["--max-seconds", "inf"], "--max-seconds: expected a number > 0, got 'inf'"),
        (["--k", "0"], "--k: expected a whole number >= 1 and <= 64, got '0'"),
        (["--k", "2.5"], "--k: expected a whole number >= 1 and <= 64, got '2.5'"),
        (["--k", "1e9"], "--k: expected a whole number >= 1 and <= 64, got '1e9'"),
        (["--k", "65"], "--k: expected a whole number >= 1 and <= 64, got '65'"),
        (["--threshold", "1"], "--threshold: expected a number >= 0 and < 1, got '1'"),
        (["--runtime-layer", "-1"], "--runtime-layer: expected a whole number >= 0, got '-1'"),
    ],
)
def test_bad_options_get_one_message_naming_them(capsys, sample_clips, option, message):
    with pytest.raises(SystemExit) as stop:  # argparse's own refusal, before any work
        main(["decode", str(sample_clips[0].path), "--no-store", *option])
    assert stop.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["bench", "--repeats", "0"], "--repeats: expected a whole number >= 1, got '0'"),
        (["experiment", "--clips", "-3"], "--clips: expected a whole number >= 1, got '-3'"),
        (["experiment", "--threshold", "0,nan"], "--threshold: expected a number >= 0 and < 1, got 'nan'"),
        (["train", "--lr", "0"], "--lr: expected a number > 0, got '0'"),
        (["runs", "list", "--k", "x"], "--k: expected a whole number >= 1, got 'x'"),
    ],
)
def test_bad_numbers_are_refused_by_every_command(capsys, argv, message):
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2 and message in capsys.readouterr().err


def test_a_mistyped_store_folder_is_refused_and_not_made(capsys, tmp_path):
    with pytest.raises(SystemExit) as stop:  # argparse refuses it, before any work
        main(["runs", "list", "--db", str(tmp_path / "typo" / "x.duckdb")])
    assert stop.value.code == 2
    assert "typo does not exist" in capsys.readouterr().err and not (tmp_path / "typo").exists()


def test_clips_with_one_stem_keep_their_file_names_in_the_store(capsys, sample_clips, tmp_path):
    db = tmp_path / "runs.duckdb"
    audio, rate = soundfile.read(sample_clips[0].path)
    for name in ("clip.wav", "clip.flac"):
        soundfile.write(tmp_path / name, audio, rate)
        assert main(["decode", str(tmp_path / name), "--draft", "random", "--k", "2", "--db", str(db)]) == 0
    assert sorted(Store(db).runs().first_clip) == ["clip.flac", "clip.wav"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["bench", "--clips", "1", "--window", "runtime", "--runtime-layer", "9", "--no-store"], "layers 0..3"),
        (["matched", "--clips", "1", "--window", "runtime", "--runtime-layer", "9"], "layers 0..3"),
        (["train", "--real", "0", "--espeak", "0", "--hibari", "0"], "no training clips: give at least one of"),
    ],
)
def test_settings_that_do_not_fit_are_refused_before_any_work(capsys, speech, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1].startswith("error: ") and message in err


def _no_weights(monkeypatch) -> None:
    def load_target(*args):
        raise AssertionError("the target's weights were loaded")

    monkeypatch.setattr("specasr.pipeline.load_target", load_target)


@pytest.mark.parametrize(
    "argv",
    [
        ["decode", "{clip}", "--window", "runtime", "--runtime-layer", "99", "--no-store"],
        ["bench", "--clips", "1", "--window", "runtime-last", "--runtime-layer", "4", "--no-store"],
        ["experiment", "--clips", "1", "--window", "unrestricted,runtime", "--runtime-layer", "4"],
        ["matched", "--clips", "1", "--window", "unrestricted,runtime", "--runtime-layer", "4"],
    ],
)
def test_a_runtime_layer_the_target_lacks_is_refused_before_its_weights_load(
    capsys, monkeypatch, sample_clips, tmp_path, argv
):
    _no_weights(monkeypatch)
    argv = [arg.format(clip=sample_clips[0].path) for arg in argv]
    db = [] if "--no-store" in argv else ["--db", str(tmp_path / "runs.duckdb")]
    assert main([*argv, *db]) == 2
    layer = argv[argv.index("--runtime-layer") + 1]
    last = capsys.readouterr().err.splitlines()[-1]
    assert last == f"error: runtime layer {layer} is not one of the target's decoder layers 0..3"


def test_a_runtime_layer_is_ignored_by_the_windows_that_read_none(capsys, sample_clips):
    argv = ["decode", str(sample_clips[0].path), "--draft", "random", "--k", "2", "--runtime-layer", "99"]
    assert main([*argv, "--window", "unrestricted", "--no-store", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["settings"]["runtime_layer"] is None and "cooler judgment" in record["text"]
