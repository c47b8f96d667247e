"""Load a target recognizer by name: a built-in Whisper, or a local transformers folder or hub id of a supported
family (Whisper, Qwen3-ASR, Voxtral)."""

import json
from pathlib import Path

import numpy as np
import torch
from transformers import (
    AutoConfig,
    AutoFeatureExtractor,
    AutoProcessor,
    AutoTokenizer,
    GenerationConfig,
    Qwen3ASRForConditionalGeneration,
    VoxtralForConditionalGeneration,
    WhisperFeatureExtractor,
    WhisperForConditionalGeneration,
    WhisperTokenizer,
)

from specasr.audio import SAMPLE_RATE
from specasr.targets.base import DecoderOutput, FrozenHead, Target
from specasr.targets.builtin import BUILTIN_TARGETS, TargetUnavailableError, builtin_model_dir
from specasr.targets.prefix import PrefixTarget, Qwen3ASRTarget, VoxtralTarget
from specasr.targets.whisper import WhisperTarget

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
FAMILIES = ("whisper", "qwen3_asr", "voxtral")  # transformers model types

__all__ = [
    "BUILTIN_TARGETS",
    "DTYPES",
    "FAMILIES",
    "DecoderOutput",
    "FrozenHead",
    "PrefixTarget",
    "Qwen3ASRTarget",
    "Target",
    "TargetUnavailableError",
    "VoxtralTarget",
    "WhisperTarget",
    "load_target",
]


def resolve_device(device: str) -> torch.device:
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise TargetUnavailableError("--device cuda was asked for, but torch sees no CUDA device")
    return torch.device(device)


def load_target(name: str, device: str = "cpu", dtype: str = "float32") -> Target:
    """A target by built-in name (see BUILTIN_TARGETS), local transformers folder, or hub id."""
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    torch_device = resolve_device(device)
    if name in BUILTIN_TARGETS:
        target = _load_whisper(name, builtin_model_dir(name), DTYPES[dtype], torch_device)
        target.runtime_layer = BUILTIN_TARGETS[name].runtime_layer
        return target
    if not Path(name).is_dir() and not _is_hub_id(name):
        raise TargetUnavailableError(
            f"no target {name!r}: it is not a local folder; use one of {', '.join(BUILTIN_TARGETS)}, "
            "a local model folder, or a hub id (owner/name)"
        )
    family = _family(name)
    load = {"whisper": _load_whisper, "qwen3_asr": _load_qwen3_asr, "voxtral": _load_voxtral}[family]
    try:
        return load(name, name, DTYPES[dtype], torch_device)
    except (OSError, ValueError) as error:
        raise TargetUnavailableError(f"could not load {family} target {name!r}: {error}") from error


def _is_hub_id(name: str) -> bool:
    owner, _, model = name.partition("/")
    return bool(owner and model) and "/" not in model and not name.startswith((".", "~"))


def _family(source: str) -> str:
    try:
        config = (
            json.loads((Path(source) / "config.json").read_text())
            if Path(source).is_dir()
            else AutoConfig.from_pretrained(source).to_dict()
        )
    except (OSError, ValueError) as error:
        raise TargetUnavailableError(f"could not read the model config of {source!r}: {error}") from error
    family = config.get("model_type")
    if family not in FAMILIES:
        raise TargetUnavailableError(
            f"{source!r} is a {family!r} model; specasr reads these families: {', '.join(FAMILIES)}"
        )
    return family


def _load_whisper(name: str, source, dtype: torch.dtype, device: torch.device) -> WhisperTarget:
    try:
        model = WhisperForConditionalGeneration.from_pretrained(source, dtype=dtype)
        tokenizer = WhisperTokenizer.from_pretrained(source)
        feature_extractor = WhisperFeatureExtractor.from_pretrained(source)
    except (OSError, ValueError) as error:
        raise TargetUnavailableError(f"could not load target {name!r} from {source}: {error}") from error
    return WhisperTarget(name, model.to(device), tokenizer, feature_extractor)


def _split_prompt(ids: list[int], audio_token_id: int) -> tuple[list[int], list[int]]:
    """The transcription request's token ids before its audio placeholders, and after them."""
    if audio_token_id not in ids:
        raise ValueError(f"the processor's transcription request holds no audio token {audio_token_id}")
    first, last = ids.index(audio_token_id), len(ids) - ids[::-1].index(audio_token_id)
    return ids[:first], ids[last:]


def _eos_ids(source: str, config) -> list[int]:
    try:
        eos = GenerationConfig.from_pretrained(source).eos_token_id
    except OSError:
        eos = getattr(config, "eos_token_id", None) or config.text_config.eos_token_id
    return list(eos) if isinstance(eos, (list, tuple)) else [eos]


def _load_qwen3_asr(name: str, source: str, dtype: torch.dtype, device: torch.device) -> Qwen3ASRTarget:
    model = Qwen3ASRForConditionalGeneration.from_pretrained(source, dtype=dtype).to(device)
    processor = AutoProcessor.from_pretrained(source)
    request = processor.apply_transcription_request(np.zeros(SAMPLE_RATE, np.float32), language="English")
    head, prompt = _split_prompt(request["input_ids"][0].tolist(), model.config.audio_token_id)
    return Qwen3ASRTarget(
        name, model, processor.tokenizer, processor.feature_extractor, head, prompt, _eos_ids(source, model.config)
    )


def _load_voxtral(name: str, source: str, dtype: torch.dtype, device: torch.device) -> VoxtralTarget:
    model = VoxtralForConditionalGeneration.from_pretrained(source, dtype=dtype).to(device)
    try:
        processor = AutoProcessor.from_pretrained(source)
        silence = np.zeros(SAMPLE_RATE, np.float32)
        request = processor.apply_transcription_request(
            audio=silence, model_id=source, language="en", sampling_rate=SAMPLE_RATE, format=["wav"]
        )
    except ImportError as error:
        raise TargetUnavailableError(f"Voxtral's transcription prompt needs mistral-common: {error}") from error
    head, prompt = _split_prompt(request["input_ids"][0].tolist(), model.config.audio_token_id)
    tokenizer = getattr(processor, "tokenizer", None) or AutoTokenizer.from_pretrained(source)
    feature_extractor = getattr(processor, "feature_extractor", None) or AutoFeatureExtractor.from_pretrained(source)
    return VoxtralTarget(name, model, tokenizer, feature_extractor, head, prompt, _eos_ids(source, model.config))
