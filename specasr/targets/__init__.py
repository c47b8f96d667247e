"""Load a target recognizer by name: a built-in, a local transformers Whisper folder, or a hub id."""

from pathlib import Path

import torch
from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration, WhisperTokenizer

from specasr.targets.builtin import BUILTIN_TARGETS, TargetUnavailableError, builtin_model_dir
from specasr.targets.whisper import FRAME_MS, FRAME_SECONDS, DecoderOutput, KVCache, WhisperTarget

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

__all__ = [
    "BUILTIN_TARGETS",
    "DTYPES",
    "FRAME_MS",
    "FRAME_SECONDS",
    "DecoderOutput",
    "KVCache",
    "TargetUnavailableError",
    "WhisperTarget",
    "load_target",
]


def resolve_device(device: str) -> torch.device:
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise TargetUnavailableError("--device cuda was asked for, but torch sees no CUDA device")
    return torch.device(device)


def load_target(name: str, device: str = "cpu", dtype: str = "float32") -> WhisperTarget:
    """A Whisper target by built-in name (see BUILTIN_TARGETS), local folder, or hub id."""
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    torch_device = resolve_device(device)
    source = builtin_model_dir(name) if name in BUILTIN_TARGETS else name
    if name not in BUILTIN_TARGETS and not Path(name).is_dir() and "/" not in name:
        raise TargetUnavailableError(
            f"unknown target {name!r}: use one of {', '.join(BUILTIN_TARGETS)}, a local Whisper folder, or a hub id"
        )
    try:
        model = WhisperForConditionalGeneration.from_pretrained(source, dtype=DTYPES[dtype])
        tokenizer = WhisperTokenizer.from_pretrained(source)
        feature_extractor = WhisperFeatureExtractor.from_pretrained(source)
    except (OSError, ValueError) as error:
        raise TargetUnavailableError(f"could not load target {name!r} from {source}: {error}") from error
    target = WhisperTarget(name, model.to(torch_device), tokenizer, feature_extractor)
    if name in BUILTIN_TARGETS:
        target.runtime_layer = BUILTIN_TARGETS[name].runtime_layer
    return target
