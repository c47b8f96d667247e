"""The Dataset page as a user drives it (Streamlit AppTest): a folder of clips decoded clip by clip into the store,
decoded again without a single new decode, shown again from the store in a fresh session, and a row opened."""

from test_app import fill_the_disk, frame_with, page, use_random_draft

from specasr.clipset import COLUMNS, COMMAND
from specasr.dataset import DEFAULT_SPEECH_DIR, load_manifest, spread
from specasr.store import Store

HEADER = "id\tpath\tduration_s\tspeaker\ttext\n"


def dataset_page(clips: int):
    app = page("dataset")
    use_random_draft(app, k=2)
    app.number_input(key="dataset_count").set_value(clips)
    return app.run()


def dataset_runs() -> int:
    return int((Store().runs().command == COMMAND).sum())


def test_the_page_decodes_a_folder_resumes_from_the_store_and_opens_a_clip(speech):
    app = dataset_page(5)
    assert app.text_input(key="dataset_folder").value == str(DEFAULT_SPEECH_DIR)
    assert "None of these clips is stored" in app.info[0].value
    before = dataset_runs()

    app.button(key="decode_set").click().run()
    assert not app.exception and not app.error
    assert app.success[0].value.startswith("5 clips decoded and stored; 0 reused")
    table = frame_with(app, "clip_id", "wer", "anchor_error_ms")
    assert list(table.columns) == COLUMNS and len(table) == 5
    assert set(table.clip_id) == {u.id for u in spread(load_manifest(), 5)}
    assert table.anchor_error_ms.notna().all()  # decoded with reference frames
    worst_first = table.sort_values(["wer", "L"], ascending=[False, True], kind="stable")
    assert table.clip_id.tolist() == worst_first.clip_id.tolist()
    assert dataset_runs() == before + 5  # one run per clip, stored as it finished

    app.button(key="decode_set").click().run()
    assert app.success[0].value.startswith("0 clips decoded and stored; 5 reused")
    assert dataset_runs() == before + 5

    fresh = dataset_page(5)  # a reload: the stored results, without decoding
    assert not fresh.exception and not fresh.error
    shown = frame_with(fresh, "clip_id", "wer", "anchor_error_ms")
    assert shown.equals(table)
    assert "5 of these 5 clips are stored" in " ".join(c.value for c in fresh.caption)

    subset = shown["set"].iloc[0]
    fresh.multiselect(key="dataset_sets").set_value([subset]).run()
    filtered = frame_with(fresh, "clip_id", "wer", "anchor_error_ms")
    assert len(filtered) == (shown["set"] == subset).sum() and (filtered["set"] == subset).all()

    chosen = next(frame for frame in fresh.dataframe if frame.key and frame.key.startswith("dataset_table"))
    fresh.session_state[chosen.key] = {"selection": {"rows": [0], "columns": [], "cells": []}}
    fresh.run()
    link = fresh.get("page_link")[0].proto
    assert link.page_script_hash and f"Open {filtered.clip_id.iloc[0]} on Live decode" in link.label
    assert link.query_string == f"run={filtered.run_id.iloc[0]}&clip={filtered.clip_id.iloc[0]}"


def test_a_set_the_store_cannot_take_stays_on_screen_and_says_so(speech, monkeypatch):
    full_disk = fill_the_disk(monkeypatch)
    before = dataset_runs()
    app = page("dataset")
    use_random_draft(app, k=3)  # settings no other test stores a set under: every clip is decoded
    app.number_input(key="dataset_count").set_value(2).run()
    app.button(key="decode_set").click().run()
    assert not app.exception and not app.error
    assert not app.success  # nothing was stored: no "0 clips decoded and stored" above the warning
    assert [w.value for w in app.warning] == [f"2 clips decoded but not stored: {full_disk}"]
    table = frame_with(app, "clip_id", "wer", "anchor_error_ms")
    assert set(table.clip_id) == {u.id for u in spread(load_manifest(), 2)} and table.run_id.isna().all()
    assert table.L.notna().all() and table.anchor_error_ms.notna().all()
    assert dataset_runs() == before

    chosen = next(frame for frame in app.dataframe if frame.key and frame.key.startswith("dataset_table"))
    app.session_state[chosen.key] = {"selection": {"rows": [0], "columns": [], "cells": []}}
    app.run()
    assert not app.get("page_link") and frame_with(app, "clip_id", "wer").equals(table)
    assert any("was not stored, so it cannot be opened on Live decode" in c.value for c in app.caption)


def test_a_folder_without_a_manifest_says_so(tmp_path):
    app = page("dataset")
    app.text_input(key="dataset_folder").set_value(str(tmp_path)).run()
    assert not app.exception
    assert app.error[0].value.startswith(f"no manifest {tmp_path / 'manifest.tsv'}")
    assert not app.get("button") or all(b.key != "decode_set" for b in app.button)


def test_an_uploaded_set_is_decoded_with_its_audio_kept(speech):
    chosen = speech[-2:]  # clips no other test decodes or stores
    rows = "".join(f"{u.id}\taudio/{u.path.name}\t{u.duration}\t{u.speaker}\t{u.text}\n" for u in chosen)
    app = page("dataset")
    use_random_draft(app, k=2)
    app.radio(key="dataset_source").set_value("an upload").run()
    files = [("manifest.tsv", (HEADER + rows).encode(), "text/tab-separated-values")]
    files += [(u.path.name, u.path.read_bytes(), "audio/wav") for u in chosen]
    app.get("file_uploader")[0].set_value(files[:2]).run()  # the second clip's file left out
    missing = f"audio/{chosen[1].path.name} (1 of 2)"
    assert app.error[0].value == f"audio files the manifest names were not uploaded: {missing}"

    app.get("file_uploader")[0].set_value(files).run()
    assert not app.error and any(c.value.startswith("Saved in ") for c in app.caption)
    app.button(key="decode_set").click().run()
    assert not app.exception and not app.error
    assert set(frame_with(app, "clip_id", "wer").clip_id) == {u.id for u in chosen}
    assert all(Store().audio(u.clip().hash) is not None for u in chosen)  # an upload's files may not last
