import json
import subprocess
import sys

from specasr.cli import main


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


def test_user_mistakes_exit_non_zero_without_traceback(tmp_path):
    not_audio = tmp_path / "notes.wav"
    not_audio.write_text("this is not a wave file")
    for args in (["transcribe", str(not_audio)], ["transcribe", str(tmp_path / "missing.wav")]):
        done = subprocess.run([sys.executable, "-m", "specasr", *args], capture_output=True, text=True)
        assert done.returncode == 2
        assert done.stderr.startswith("error:") and "Traceback" not in done.stderr
        assert done.stdout == ""


def test_unknown_target_is_a_user_error(capsys, sample_clips):
    assert main(["transcribe", str(sample_clips[0].path), "--target", "whisper-huge"]) == 2
    assert "unknown target" in capsys.readouterr().err
