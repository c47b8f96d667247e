"""Metrics computed from traces: word error rate (more follow with the speculative engine)."""

import json
from functools import cache
from importlib.resources import files

import jiwer
from transformers.models.whisper.english_normalizer import EnglishTextNormalizer


@cache
def _normalizer() -> EnglishTextNormalizer:
    # Whisper's British-to-American spelling table; transformers ships the normalizer but not the table.
    spelling = json.loads(files("whisper_normalizer").joinpath("normalizers/english.json").read_text())
    return EnglishTextNormalizer(spelling)


def normalize_text(text: str) -> str:
    """Whisper's English text normalizer (casing, punctuation, numbers, spelling)."""
    return _normalizer()(text)


def word_error_rate(references: list[str], hypotheses: list[str]) -> float:
    """Corpus WER (total edits / total reference words) after Whisper's English normalization."""
    pairs = [(normalize_text(r), normalize_text(h)) for r, h in zip(references, hypotheses, strict=True)]
    pairs = [(r, h) for r, h in pairs if r]
    if not pairs:
        raise ValueError("no reference words to score")
    refs, hyps = zip(*pairs, strict=True)
    return jiwer.wer(list(refs), list(hyps))
