"""Read CTranslate2 Whisper weights (faster-whisper's model.bin) into a transformers state dict.

Layout of model.bin, binary version 6 (ctranslate2/specs/model_spec.py, `_serialize`):
    u32 version | str spec name | u32 revision | u32 n_vars
    n_vars x (str name | u8 rank | u32 dims[rank] | u8 dtype | u32 nbytes | bytes)
    u32 n_aliases | n_aliases x (str alias | str target)
where str = u16 length (NUL included) + utf-8 bytes + NUL.
"""

import re
import struct
from pathlib import Path

import numpy as np
from transformers import WhisperConfig

CT2_DTYPES = {
    0: np.float32,
    1: np.int8,
    2: np.int16,
    3: np.int32,
    4: np.float16,
    # bfloat16 (5) has no numpy dtype; Whisper CT2 exports are float16 or int8.
}
SUPPORTED_VERSION = 6


class CT2FormatError(ValueError):
    """The file is not a CTranslate2 Whisper model this reader understands."""


class _Reader:
    def __init__(self, data: bytes):
        self.data = data
        self.offset = 0

    def take(self, fmt: str) -> tuple:
        values = struct.unpack_from("<" + fmt, self.data, self.offset)
        self.offset += struct.calcsize("<" + fmt)
        return values

    def string(self) -> str:
        (length,) = self.take("H")
        text = self.data[self.offset : self.offset + length - 1].decode("utf-8")
        self.offset += length
        return text


def read_ct2_variables(model_bin: bytes) -> dict[str, np.ndarray]:
    """Every variable of a CTranslate2 model.bin, zero-copy, aliases resolved."""
    reader = _Reader(model_bin)
    try:
        (version,) = reader.take("I")
        if version != SUPPORTED_VERSION:
            raise CT2FormatError(f"CTranslate2 binary version {version}; only {SUPPORTED_VERSION} is supported")
        spec = reader.string()
        if spec != "WhisperSpec":
            raise CT2FormatError(f"model.bin holds a {spec!r}, not a Whisper model")
        reader.take("I")  # spec revision
        (n_vars,) = reader.take("I")
        variables = {}
        for _ in range(n_vars):
            name = reader.string()
            (rank,) = reader.take("B")
            shape = reader.take(f"{rank}I")
            dtype_id, nbytes = reader.take("BI")
            if dtype_id not in CT2_DTYPES:
                raise CT2FormatError(f"variable {name!r} has unsupported CTranslate2 dtype id {dtype_id}")
            dtype = CT2_DTYPES[dtype_id]
            count = nbytes // np.dtype(dtype).itemsize
            variables[name] = np.frombuffer(model_bin, dtype, count, reader.offset).reshape(shape)
            reader.offset += nbytes
        (n_aliases,) = reader.take("I")
        for _ in range(n_aliases):
            alias, target = reader.string(), reader.string()
            variables[alias] = variables[target]
    except struct.error as error:
        raise CT2FormatError(f"model.bin is truncated or corrupt: {error}") from error
    if reader.offset != len(model_bin):
        raise CT2FormatError(f"model.bin has {len(model_bin) - reader.offset} unexpected trailing bytes")
    return variables


def _layer_count(variables: dict[str, np.ndarray], stack: str) -> int:
    pattern = re.compile(rf"{stack}/layer_(\d+)/")
    return 1 + max(int(m.group(1)) for name in variables if (m := pattern.match(name)))


def whisper_config(variables: dict[str, np.ndarray]) -> WhisperConfig:
    """A transformers WhisperConfig whose sizes are read off the weight shapes."""
    vocab_size, d_model = variables["decoder/embeddings/weight"].shape
    return WhisperConfig(
        vocab_size=vocab_size,
        num_mel_bins=variables["encoder/conv1/weight"].shape[1],
        d_model=d_model,
        encoder_layers=_layer_count(variables, "encoder"),
        decoder_layers=_layer_count(variables, "decoder"),
        encoder_attention_heads=int(variables["encoder/num_heads"]),
        decoder_attention_heads=int(variables["decoder/num_heads"]),
        encoder_ffn_dim=variables["encoder/layer_0/ffn/linear_0/weight"].shape[0],
        decoder_ffn_dim=variables["decoder/layer_0/ffn/linear_0/weight"].shape[0],
        max_source_positions=variables["encoder/position_encodings/encodings"].shape[0],
        max_target_positions=variables["decoder/position_encodings/encodings"].shape[0],
        tie_word_embeddings=True,
    )


def _linear(out: dict, prefix: str, variables: dict, source: str, has_bias: bool = True) -> None:
    out[f"{prefix}.weight"] = variables[f"{source}/weight"]
    if has_bias:
        out[f"{prefix}.bias"] = variables[f"{source}/bias"]


def _norm(out: dict, prefix: str, variables: dict, source: str) -> None:
    out[f"{prefix}.weight"] = variables[f"{source}/gamma"]
    out[f"{prefix}.bias"] = variables[f"{source}/beta"]


def _split_linear(out: dict, prefixes: list[str], variables: dict, source: str) -> None:
    """A fused projection split into equal parts; key projections carry no bias in transformers."""
    weights = np.split(variables[f"{source}/weight"], len(prefixes))
    biases = np.split(variables[f"{source}/bias"], len(prefixes))
    for prefix, weight, bias in zip(prefixes, weights, biases, strict=True):
        out[f"{prefix}.weight"] = weight
        if not prefix.endswith("k_proj"):
            out[f"{prefix}.bias"] = bias


def _self_attention(out: dict, hf: str, variables: dict, ct2: str) -> None:
    _split_linear(out, [f"{hf}.self_attn.{p}_proj" for p in "qkv"], variables, f"{ct2}/self_attention/linear_0")
    _linear(out, f"{hf}.self_attn.out_proj", variables, f"{ct2}/self_attention/linear_1")
    _norm(out, f"{hf}.self_attn_layer_norm", variables, f"{ct2}/self_attention/layer_norm")


def _feed_forward(out: dict, hf: str, variables: dict, ct2: str) -> None:
    _linear(out, f"{hf}.fc1", variables, f"{ct2}/ffn/linear_0")
    _linear(out, f"{hf}.fc2", variables, f"{ct2}/ffn/linear_1")
    _norm(out, f"{hf}.final_layer_norm", variables, f"{ct2}/ffn/layer_norm")


def whisper_state_dict(variables: dict[str, np.ndarray], config: WhisperConfig) -> dict[str, np.ndarray]:
    """Map CTranslate2 variable names onto WhisperForConditionalGeneration's state dict."""
    out: dict[str, np.ndarray] = {}
    for stack, n_layers in (("encoder", config.encoder_layers), ("decoder", config.decoder_layers)):
        hf_stack = f"model.{stack}"
        out[f"{hf_stack}.embed_positions.weight"] = variables[f"{stack}/position_encodings/encodings"]
        _norm(out, f"{hf_stack}.layer_norm", variables, f"{stack}/layer_norm")
        for i in range(n_layers):
            hf, ct2 = f"{hf_stack}.layers.{i}", f"{stack}/layer_{i}"
            _self_attention(out, hf, variables, ct2)
            _feed_forward(out, hf, variables, ct2)
            if stack == "decoder":
                _linear(out, f"{hf}.encoder_attn.q_proj", variables, f"{ct2}/attention/linear_0")
                _split_linear(
                    out,
                    [f"{hf}.encoder_attn.k_proj", f"{hf}.encoder_attn.v_proj"],
                    variables,
                    f"{ct2}/attention/linear_1",
                )
                _linear(out, f"{hf}.encoder_attn.out_proj", variables, f"{ct2}/attention/linear_2")
                _norm(out, f"{hf}.encoder_attn_layer_norm", variables, f"{ct2}/attention/layer_norm")
    for conv in ("conv1", "conv2"):
        _linear(out, f"model.encoder.{conv}", variables, f"encoder/{conv}")
    out["model.decoder.embed_tokens.weight"] = variables["decoder/embeddings/weight"]
    return out


def load_ct2_whisper(model_bin: Path | bytes) -> tuple[WhisperConfig, dict[str, np.ndarray]]:
    """Config and transformers state dict for a CTranslate2 Whisper model.bin (path or bytes)."""
    data = model_bin if isinstance(model_bin, bytes) else Path(model_bin).read_bytes()
    variables = read_ct2_variables(data)
    config = whisper_config(variables)
    return config, whisper_state_dict(variables, config)
