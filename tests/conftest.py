import pytest

from specasr.dataset import DEFAULT_SPEECH_DIR, Utterance, load_manifest
from specasr.targets import WhisperTarget, load_target

# A few short clips from different sources of the shared developer set.
SAMPLE_IDS = (
    "cathy-arctic-a0025",
    "ls-test-other-1688-142285-0003",
    "ls-dev-clean-1988-24833-0000",
    "librivox-sense-and-sensibility-01-0880",
)


@pytest.fixture(scope="session")
def speech() -> list[Utterance]:
    if not (DEFAULT_SPEECH_DIR / "manifest.tsv").is_file():
        pytest.skip(f"shared speech data not found at {DEFAULT_SPEECH_DIR}")
    return load_manifest()


@pytest.fixture(scope="session")
def sample_clips(speech) -> list[Utterance]:
    by_id = {u.id: u for u in speech}
    return [by_id[i] for i in SAMPLE_IDS]


@pytest.fixture(scope="session")
def tiny_en() -> WhisperTarget:
    return load_target("whisper-tiny.en")


@pytest.fixture(scope="session")
def base() -> WhisperTarget:
    return load_target("whisper-base")
