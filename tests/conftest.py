from dataclasses import replace
from functools import cache

import pytest
import torch
from tokenizers import Tokenizer
from tokenizers.decoders import WordPiece
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit
from transformers import (
    GenerationConfig,
    PreTrainedTokenizerFast,
    Qwen3ASRConfig,
    Qwen3ASRFeatureExtractor,
    Qwen3ASRForConditionalGeneration,
    VoxtralConfig,
    VoxtralForConditionalGeneration,
    WhisperConfig,
    WhisperFeatureExtractor,
    WhisperForConditionalGeneration,
    WhisperTokenizer,
)

from specasr.dataset import DEFAULT_SPEECH_DIR, Utterance, load_manifest
from specasr.loops import loop_for
from specasr.pipeline import Pipeline
from specasr.store import Store
from specasr.targets import PrefixTarget, Qwen3ASRTarget, VoxtralTarget, WhisperTarget
from specasr.targets.builtin import builtin_model_dir
from specasr.trace import Settings

# A few short clips from different sources of the shared developer set.
SAMPLE_IDS = (
    "cathy-arctic-a0025",
    "ls-test-other-1688-142285-0003",
    "ls-dev-clean-1988-24833-0000",
    "librivox-sense-and-sensibility-01-0880",
)


@pytest.fixture(autouse=True, scope="session")
def private_run_store(tmp_path_factory):
    """Runs the tests store go to a file of their own, never to the user's cache/runs.duckdb."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPECASR_DB", str(tmp_path_factory.mktemp("store") / "runs.duckdb"))
        yield


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
def pipeline() -> Pipeline:
    """One pipeline for the session, without a store: targets and drafts load once."""
    return Pipeline()


@pytest.fixture(scope="session")
def tiny_en(pipeline) -> WhisperTarget:
    return pipeline.target(Settings(target="whisper-tiny.en"))


@pytest.fixture(scope="session")
def base(pipeline) -> WhisperTarget:
    return pipeline.target(Settings(target="whisper-base"))


@cache
def _tiny_en_text_tools() -> tuple[WhisperTokenizer, WhisperFeatureExtractor]:
    folder = builtin_model_dir("whisper-tiny.en")
    return WhisperTokenizer.from_pretrained(folder), WhisperFeatureExtractor.from_pretrained(folder)


def random_whisper_target(
    seed: int, layers: int, heads: int, vocab_size: int, max_length: int, init_std: float = 0.02
) -> WhisperTarget:
    """A tiny randomly initialised Whisper with a small vocabulary, so random drafts are often right.

    Token 1 is end-of-text, 2 start-of-transcript, 3 no-timestamps; 4 is suppressed, 5 never comes first.
    Small init_std gives repetitive output, large init_std erratic output.
    """
    torch.manual_seed(seed)
    d_model = 16 * heads
    config = WhisperConfig(
        vocab_size=vocab_size,
        d_model=d_model,
        encoder_layers=1,
        decoder_layers=layers,
        encoder_attention_heads=heads,
        decoder_attention_heads=heads,
        encoder_ffn_dim=2 * d_model,
        decoder_ffn_dim=2 * d_model,
        max_source_positions=40,
        max_target_positions=max_length,
        pad_token_id=1,
        bos_token_id=1,
        eos_token_id=1,
        decoder_start_token_id=2,
        begin_suppress_tokens=[5],
        init_std=init_std,
    )
    model = WhisperForConditionalGeneration(config)
    model.generation_config = GenerationConfig(
        decoder_start_token_id=2,
        eos_token_id=1,
        no_timestamps_token_id=3,
        suppress_tokens=[4],
        begin_suppress_tokens=[5],
        max_length=max_length,
    )
    return WhisperTarget("random-whisper", model, *_tiny_en_text_tools())


def random_prefix_target(
    family: str,
    seed: int,
    layers: int,
    heads: int,
    vocab_size: int,
    max_length: int,
    init_std: float = 0.02,
    kv_heads: int | None = None,
) -> PrefixTarget:
    """A tiny randomly initialised audio-prefix LLM (Qwen3-ASR or Voxtral) with a word-per-id tokenizer ("w5" is 5).

    Ids: 1 ends the text (and 6, for Qwen3-ASR, whose checkpoints end on either of two ids), 2 comes before the
    audio, 3 and 0 after it (the prompt); the last id is the audio placeholder.
    """
    torch.manual_seed(seed)
    head_dim = 8
    text = {
        "vocab_size": vocab_size,
        "hidden_size": heads * head_dim,
        "intermediate_size": 3 * heads * head_dim,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads or max(1, heads // 2),
        "head_dim": head_dim,
        "max_position_embeddings": 2048,
        "initializer_range": init_std,
        "rms_norm_eps": 1e-6,
    }
    audio_token, eos = vocab_size - 1, [1, 6] if family == "qwen3_asr" else [1]
    if family == "qwen3_asr":
        config = Qwen3ASRConfig(
            audio_config={"encoder_layers": 1, "encoder_attention_heads": 2, "encoder_ffn_dim": 32, "d_model": 16,
                          "output_dim": heads * head_dim, "n_window_infer": 200, "downsample_hidden_size": 8},
            text_config={**text, "tie_word_embeddings": True},
            audio_token_id=audio_token, eos_token_id=eos, pad_token_id=1, initializer_range=init_std,
        )  # fmt: skip
        model, kind, features = Qwen3ASRForConditionalGeneration(config), Qwen3ASRTarget, Qwen3ASRFeatureExtractor()
    else:
        config = VoxtralConfig(
            audio_config={"hidden_size": 16, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2},
            text_config=text, audio_token_id=audio_token,
        )  # fmt: skip
        model, kind, features = VoxtralForConditionalGeneration(config), VoxtralTarget, WhisperFeatureExtractor(128)
    return kind(f"random-{family}", model.eval(), _word_tokenizer(vocab_size), features, [2], [3, 0], eos, max_length)


def _word_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    words = Tokenizer(WordLevel({f"w{i}": i for i in range(vocab_size)}, unk_token="w0"))
    words.pre_tokenizer = WhitespaceSplit()
    words.decoder = WordPiece(prefix="##")  # joins words with spaces
    return PreTrainedTokenizerFast(tokenizer_object=words, eos_token="w1")


def run_loop(target, draft, memory, valid_frames, settings, reference=None, captured=False, kept=None):
    """One segment through the loop `settings` decode with (`loops.loop_for`): stepped from the host, or as the
    captured steps CUDA replays, run eagerly here. kept: where captured steps are kept between segments."""
    return loop_for(target, draft, replace(settings, graphs=captured), kept)(memory, valid_frames, reference=reference)


@pytest.fixture
def store(tmp_path) -> Store:
    """An empty run store of the test's own."""
    return Store(tmp_path / "runs.duckdb")
