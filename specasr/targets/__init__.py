"""Load a target recognizer by name: a built-in Whisper, or a local transformers folder or hub id of a supported
family (Whisper, Qwen3-ASR, Voxtral)."""

import json
from functools import cache
from pathlib import Path

import torch
from transformers import AutoConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration, WhisperTokenizer

from specasr.targets.base import DecoderOutput, FrozenHead, Target
from specasr.targets.builtin import BUILTIN_TARGETS, TargetUnavailableError, builtin_model_dir
from specasr.targets.prefix import PrefixTarget, Qwen3ASRTarget, VoxtralTarget
from specasr.targets.whisper import WhisperTarget

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
PREFIX_FAMILIES = {"qwen3_asr": Qwen3ASRTarget, "voxtral": VoxtralTarget}  # by transformers model type
FAMILIES = ("whisper", *PREFIX_FAMILIES)

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
    "decoder_layers",
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
    if family == "whisper":
        return _load_whisper(name, name, DTYPES[dtype], torch_device)
    try:
        return PREFIX_FAMILIES[family].from_pretrained(name, DTYPES[dtype], torch_device)
    except (OSError, ValueError) as error:
        raise TargetUnavailableError(f"could not load {family} target {name!r}: {error}") from error


@cache
def decoder_layers(name: str) -> int | None:
    """A Whisper target's decoder layer count, read from its config without loading its weights (a built-in is
    converted first, once, as loading it would); None for a hub id and the other families, known once loaded."""
    folder = builtin_model_dir(name) if name in BUILTIN_TARGETS else Path(name)
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return config.get("decoder_layers") if config.get("model_type") == "whisper" else None


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
