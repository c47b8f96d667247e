"""Text normalisation for alignment and word times spread over a text's characters."""

import pytest

from specasr.words import WordTime, char_times_from_words, normalize_for_alignment


@pytest.mark.parametrize(
    ("text", "spoken"),
    [
        ("Hello, World!", "hello world"),
        ("Don't   STOP \u2014 it\u2019s fine.", "don't stop it's fine"),
        ("carving-knife; U.S.", "carving knife u s"),
        ("In 1963 he paid 1,250", "in nineteen sixty three he paid one thousand two hundred fifty"),
        ("3.5 or 1905 or 1900", "three point five or nineteen oh five or nineteen hundred"),
        ("the 1st, 22nd and 100th", "the first twenty second and one hundredth"),
        ("2005 or 7", "two thousand five or seven"),
        ("...!?", ""),
    ],
)
def test_normalize_for_alignment(text, spoken):
    assert normalize_for_alignment(text) == spoken.split()


def test_char_times_spread_each_word_over_its_characters():
    words = [WordTime("hi", 0.0, 0.2, True), WordTime("you", 0.4, 0.7, True), WordTime("there", None, None, False)]
    times = char_times_from_words("Hi, you there!", words)
    assert times[:5] == pytest.approx([0.05, 0.15, 0.45, 0.55, 0.65])
    assert times[5:] == [None] * 5


def test_char_times_give_a_rewritten_number_the_span_of_its_spoken_words():
    text = "In 19 days, don't"
    spoken = normalize_for_alignment(text)
    assert spoken == ["in", "nineteen", "days", "don't"]
    spans = [(0.0, 0.2), (0.2, 0.8), (0.8, 1.2), (1.3, 1.7)]
    words = [WordTime(word, start, end, True) for word, (start, end) in zip(spoken, spans, strict=True)]
    times = char_times_from_words(text, words)
    assert len(times) == sum(c.isalnum() for c in text.lower())
    assert times[2:4] == pytest.approx([0.35, 0.65])  # "19" spans "nineteen"
    assert times[-4:] == pytest.approx([1.35, 1.45, 1.55, 1.65])  # "don't" has four alphanumerics


def test_char_times_reject_words_of_another_text():
    with pytest.raises(ValueError):
        char_times_from_words("one two", [WordTime("one", 0.0, 0.1, True)])
