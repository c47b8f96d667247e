"""Other decoders, run through the pipeline beside ours so that `bench --peers` times them on the same clips:
faster-whisper (CTranslate2) on the bundled weights, transformers `generate` on the converted ones, and
transformers' assisted generation (`generate` verifying a smaller decoder's proposals). Each makes its own features,
encodes one 30 s window and decodes it greedily.

faster-whisper runs in a process of its own: CTranslate2 brings its own OpenMP runtime, and in our process it slowed
torch's decoding loops by a fifth once it had run (README, "Peers side by side").
"""

import copy
import multiprocessing
import sys
import types
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from itertools import count
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from transformers import AutoTokenizer, WhisperForCausalLM
from transformers.modeling_outputs import BaseModelOutput
from transformers.utils import logging as transformers_logging

from specasr.draft import DraftMismatchError
from specasr.targets import WhisperTarget
from specasr.targets.builtin import BUILTIN_TARGETS, TargetUnavailableError, bundled_ct2_dir
from specasr.targets.whisper import ENCODER_STRIDE, WINDOW_FRAMES


class Peer(Protocol):
    def samples(self, audio: np.ndarray) -> np.ndarray | torch.Tensor:
        """A clip's audio as `features` reads it (see `Target.samples`)."""

    def features(self, audio: np.ndarray | torch.Tensor): ...

    def encode(self, features): ...

    def decode(self, memory) -> list[int]:
        """The transcript tokens of one window: prompt and end-of-text excluded."""


class FasterWhisper:
    """faster-whisper's greedy decode (beam 1, temperature 0, no timestamps, no VAD, no previous-text prompt), its
    features as its `transcribe` makes them, with the target's prompt."""

    def __init__(self, name: str, prompt: Sequence[int], max_length: int, device: str, dtype: str):
        """For the built-in target `name`, with its prompt and length limit."""
        try:
            from faster_whisper import WhisperModel  # an optional peer: everything else runs without it
        except ImportError as error:
            raise TargetUnavailableError(f"faster-whisper is not installed ({error}); see requirements.txt") from error
        if name not in BUILTIN_TARGETS:
            raise TargetUnavailableError(f"faster-whisper runs the built-in targets' weights only, not {name}")
        kind, _, index = device.partition(":")
        self.model = WhisperModel(
            str(bundled_ct2_dir(name)),
            device=kind,
            device_index=int(index or 0),
            compute_type=dtype,  # float32, float16 or bfloat16: the same names in CTranslate2
            cpu_threads=torch.get_num_threads(),
        )
        self.prompt = list(prompt)
        self.max_length = max_length

    def features(self, audio: np.ndarray) -> np.ndarray:
        mel = self.model.feature_extractor(audio)[:, :-1]  # its log-mel of one window, padded with zeros to 30 s
        return np.pad(mel, ((0, 0), (0, WINDOW_FRAMES * ENCODER_STRIDE - mel.shape[1])))

    def encode(self, features: np.ndarray):
        return self.model.encode(features)

    def decode(self, memory) -> list[int]:
        result = self.model.model.generate(
            memory, [self.prompt], beam_size=1, max_length=self.max_length, suppress_blank=True, suppress_tokens=[-1]
        )
        return result[0].sequences_ids[0]


class TransformersGenerate:
    """transformers' `generate`, greedy, on the target's own model, features and generation config; with an assistant,
    its assisted generation (the assistant proposes, the target verifies: greedy's tokens, batch 1)."""

    def __init__(self, target: WhisperTarget, assistant: WhisperForCausalLM | None = None):
        self.target = target
        self.assistant = assistant

    def samples(self, audio: np.ndarray) -> torch.Tensor:
        return self.target.samples(audio)

    def features(self, audio: np.ndarray | torch.Tensor) -> torch.Tensor:
        return self.target.features(audio)

    def encode(self, features: torch.Tensor) -> torch.Tensor:
        return self.target.encode(features)

    @torch.inference_mode()
    def decode(self, memory: torch.Tensor) -> list[int]:
        target = self.target
        prompt = torch.tensor([target.prompt], device=memory.device)
        if self.assistant is None:
            asked = {"decoder_input_ids": prompt}
        else:  # assisted generation takes no decoder_input_ids: Whisper's generate makes the same prompt itself
            english = {"language": "en", "task": "transcribe"}
            multilingual = getattr(target.model.generation_config, "is_multilingual", False)
            asked = {"assistant_model": self.assistant} | (english if multilingual else {})
        with _quiet_transformers():  # assisted generation warns of its own settings at every round
            output = target.model.generate(
                encoder_outputs=BaseModelOutput(last_hidden_state=memory),
                num_beams=1,
                do_sample=False,
                max_length=target.max_length,
                return_dict_in_generate=True,  # then the sequence keeps its prompt and end-of-text
                **asked,
            )
        sequence = output.sequences[0].tolist()
        if sequence[: len(target.prompt)] != list(target.prompt):
            raise RuntimeError(f"generate decoded after the prompt {sequence[:4]}, not the target's {target.prompt}")
        tokens = sequence[len(target.prompt) :]
        return tokens[: tokens.index(target.eot)] if target.eot in tokens else tokens


@contextmanager
def _quiet_transformers():
    verbosity = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()
    try:
        yield
    finally:
        transformers_logging.set_verbosity(verbosity)


TARGET_LAYERS = "target-layers"  # an assistant made of the target's own first and last decoder layers


def load_assistant(name: str, target: WhisperTarget) -> WhisperForCausalLM:
    """An assistant decoder for transformers' assisted generation that reads the target's encoder output.

    name: `target-layers`, the target's first and last decoder layers with its embeddings and final norm (how
    distil-whisper's students start, here untrained); or a transformers Whisper folder or hub id whose decoder was
    trained on the target's encoder (a distil-whisper assistant; of a whole model only the decoder is loaded).
    """
    if name == TARGET_LAYERS:
        return _layer_assistant(target, [0, target.n_layers - 1])
    try:
        assistant = WhisperForCausalLM.from_pretrained(name, dtype=target.dtype)
    except (OSError, ValueError) as error:
        raise DraftMismatchError(f"cannot load {name!r} as a Whisper decoder: {error}") from error
    config = assistant.config
    problems = []
    if config.d_model != target.d_model:
        problems.append(f"width {config.d_model} vs the target's encoder output {target.d_model}")
    if config.vocab_size != target.vocab_size:
        problems.append(f"vocabulary {config.vocab_size} vs the target's {target.vocab_size}")
    elif _vocabulary(name) not in (None, target.tokenizer.get_vocab()):
        problems.append("a tokenizer other than the target's")
    if problems:
        raise DraftMismatchError(f"assistant {name!r} cannot draft for {target.name!r}: " + "; ".join(problems))
    return assistant.to(target.device).eval().requires_grad_(False)


def _vocabulary(name: str) -> dict[str, int] | None:
    """The assistant's own tokenizer's vocabulary, where it comes with one (transformers makes an empty tokenizer
    for a folder without its files)."""
    folder = Path(name)
    if folder.is_dir() and not any((folder / file).is_file() for file in ("tokenizer.json", "vocab.json")):
        return None
    try:
        return AutoTokenizer.from_pretrained(name).get_vocab()
    except (OSError, ValueError):
        return None


def _layer_assistant(target: WhisperTarget, layers: list[int]) -> WhisperForCausalLM:
    config = copy.deepcopy(target.model.config)
    config.decoder_layers = len(layers)
    with torch.device("meta"):  # its weights are the target's own tensors, shared, not copied
        assistant = WhisperForCausalLM(config)
    decoder = target.model.model.decoder
    kept = {
        name: weight
        for name, weight in decoder.state_dict().items()
        if not name.startswith("layers.") or int(name.split(".")[1]) in layers
    }
    renamed = {_renumber(name, layers): weight for name, weight in kept.items()}
    assistant.model.decoder.load_state_dict(renamed, assign=True)
    assistant.proj_out.weight = decoder.embed_tokens.weight  # Whisper ties its LM head to the embedding
    assistant.generation_config = copy.deepcopy(target.model.generation_config)
    return assistant.eval().requires_grad_(False)


def _renumber(name: str, layers: list[int]) -> str:
    if not name.startswith("layers."):
        return name
    _, index, rest = name.split(".", 2)
    return f"layers.{layers.index(int(index))}.{rest}"


class PeerProcess:
    """A peer served by a process of its own. Its features and encoder output stay there; handles to them, the
    audio and the tokens cross the pipe."""

    def __init__(self, target: WhisperTarget, device: str, dtype: str):
        context = multiprocessing.get_context("spawn")  # a fresh interpreter: nothing of torch's thread pool
        self._connection, child = context.Pipe()
        peer = (target.name, target.prompt, target.max_length, device, dtype)  # FasterWhisper's arguments
        self._process = context.Process(target=_serve, args=(child, *peer), daemon=True)
        with _no_main_script():
            self._process.start()
        child.close()  # the child holds its own end: should it die, recv() ends instead of waiting forever
        self._call("ready")

    def _call(self, *request):
        try:
            self._connection.send(request)
            ok, value = self._connection.recv()
        except (EOFError, BrokenPipeError):
            self._process.join(timeout=5)
            raise RuntimeError(f"the faster-whisper process ended (exit code {self._process.exitcode})") from None
        if not ok:
            raise value
        return value

    def samples(self, audio: np.ndarray) -> np.ndarray:
        return audio

    def features(self, audio: np.ndarray) -> int:
        return self._call("features", audio)

    def encode(self, features: int) -> int:
        return self._call("encode", features)

    def decode(self, memory: int) -> list[int]:
        return self._call("decode", memory)


@contextmanager
def _no_main_script() -> Iterator[None]:
    """A spawned process runs the parent's __main__ script again before its target; under Streamlit's AppTest that
    script is the dashboard. The peer needs none of it, so the child starts from an empty __main__."""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


def _serve(connection, *peer) -> None:
    """The peer process: FasterWhisper(*peer), answering PeerProcess's requests until the pipe closes."""
    held, handles = {}, count()

    def keep(value) -> int:
        handle = next(handles)
        held[handle] = value
        return handle

    try:
        whisper = FasterWhisper(*peer)
    except Exception as error:  # reported to the parent, which raises it
        connection.send((False, error))
        return
    while True:
        try:
            request, *args = connection.recv()
        except EOFError:
            return
        try:
            if request == "ready":
                answer = None
            elif request == "features":
                answer = keep(whisper.features(args[0]))
            elif request == "encode":
                answer = keep(whisper.encode(held.pop(args[0])))
            else:
                answer = whisper.decode(held.pop(args[0]))
            connection.send((True, answer))
        except Exception as error:
            connection.send((False, error))


def load_peer(name: str, target: WhisperTarget, device: str, dtype: str, assistant: str | None = None) -> Peer:
    """A peer of DECODERS by name, for `target` on `device` in `dtype` (with `assistant`: see load_assistant)."""
    if not isinstance(target, WhisperTarget):
        raise ValueError(f"the {name} peer decodes Whisper targets only, not {target.name!r}")
    if name == "faster-whisper":
        return PeerProcess(target, device, dtype)
    if name == "transformers":
        return TransformersGenerate(target)
    if name == "transformers-assisted":
        return TransformersGenerate(target, load_assistant(assistant, target))
    raise ValueError(f"no peer named {name!r}")
