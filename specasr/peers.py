"""Other decoders, run through the pipeline beside ours so that `bench --peers` times them on the same clips:
faster-whisper (CTranslate2) on the bundled weights, and transformers `generate` on the converted ones. Each
makes its own features, encodes one 30 s window and decodes it greedily.

faster-whisper runs in a process of its own: CTranslate2 brings its own OpenMP runtime, and in our process it slowed
torch's decoding loops by a fifth once it had run (README, "Peers side by side").
"""

import multiprocessing
from collections.abc import Sequence
from itertools import count
from typing import Protocol

import numpy as np
import torch
from transformers.modeling_outputs import BaseModelOutput

from specasr.targets import WhisperTarget
from specasr.targets.builtin import BUILTIN_TARGETS, TargetUnavailableError, bundled_ct2_dir
from specasr.targets.whisper import ENCODER_STRIDE, WINDOW_FRAMES


class Peer(Protocol):
    def features(self, audio: np.ndarray): ...

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
    """transformers' `generate`, greedy, on the target's own model, features and generation config."""

    def __init__(self, target: WhisperTarget):
        self.target = target

    def features(self, audio: np.ndarray) -> torch.Tensor:
        return self.target.features(audio)

    def encode(self, features: torch.Tensor) -> torch.Tensor:
        return self.target.encode(features)

    @torch.inference_mode()
    def decode(self, memory: torch.Tensor) -> list[int]:
        target = self.target
        output = target.model.generate(
            encoder_outputs=BaseModelOutput(last_hidden_state=memory),
            decoder_input_ids=torch.tensor([target.prompt], device=memory.device),
            num_beams=1,
            do_sample=False,
            max_length=target.max_length,
            return_dict_in_generate=True,  # then the sequence keeps its prompt and end-of-text
        )
        tokens = output.sequences[0, len(target.prompt) :].tolist()
        return tokens[: tokens.index(target.eot)] if target.eot in tokens else tokens


class PeerProcess:
    """A peer served by a process of its own. Its features and encoder output stay there; handles to them, the
    audio and the tokens cross the pipe."""

    def __init__(self, target: WhisperTarget, device: str, dtype: str):
        context = multiprocessing.get_context("spawn")  # a fresh interpreter: nothing of torch's thread pool
        self._connection, child = context.Pipe()
        peer = (target.name, target.prompt, target.max_length, device, dtype)  # FasterWhisper's arguments
        self._process = context.Process(target=_serve, args=(child, *peer), daemon=True)
        self._process.start()
        self._call("ready")

    def _call(self, *request):
        self._connection.send(request)
        ok, value = self._connection.recv()
        if not ok:
            raise value
        return value

    def features(self, audio: np.ndarray) -> int:
        return self._call("features", audio)

    def encode(self, features: int) -> int:
        return self._call("encode", features)

    def decode(self, memory: int) -> list[int]:
        return self._call("decode", memory)


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


def load_peer(name: str, target: WhisperTarget, device: str, dtype: str) -> Peer:
    """A peer of DECODERS by name, for `target` on `device` in `dtype`."""
    if not isinstance(target, WhisperTarget):
        raise ValueError(f"the {name} peer decodes Whisper targets only, not {target.name!r}")
    if name == "faster-whisper":
        return PeerProcess(target, device, dtype)
    if name == "transformers":
        return TransformersGenerate(target)
    raise ValueError(f"no peer named {name!r}")
