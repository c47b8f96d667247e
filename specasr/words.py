"""Word times and the text normalisation they are counted in: text -> spoken words -> times per character.

Aligners and synthesizers return one `WordTime` per word of `normalize_for_alignment(text)`: numbers spelled out,
punctuation dropped. `char_times_from_words` spreads those times back over the written text's alphanumeric
characters, which is what the token-to-frame rule (specasr.reference) counts in.
"""

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class WordTime:
    word: str
    start: float | None  # seconds; None when the word could not be placed
    end: float | None
    aligned: bool


_ONES = (
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
    "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen",
)  # fmt: skip
_TENS = ("", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
_SCALES = ((10**9, "billion"), (10**6, "million"), (1000, "thousand"), (100, "hundred"))
_IRREGULAR_ORDINALS = {
    "one": "first",
    "two": "second",
    "three": "third",
    "five": "fifth",
    "eight": "eighth",
    "nine": "ninth",
    "twelve": "twelfth",
}
# A number (with optional thousands commas, decimals and ordinal suffix) or a word with inner apostrophes. Every
# alphanumeric character of a text falls inside exactly one match ([^\W\d_] is "alphanumeric but not a digit").
_TOKEN = re.compile(r"(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d+))?(st|nd|rd|th)?|[^\W\d_]+(?:'[^\W\d_]+)*")


def number_to_words(n: int) -> list[str]:
    """American cardinal reading without "and": 1205 -> one thousand two hundred five."""
    if n < 20:
        return [_ONES[n]]
    if n < 100:
        return [_TENS[n // 10], _ONES[n % 10]] if n % 10 else [_TENS[n // 10]]
    for scale, name in _SCALES:
        if n >= scale:
            head, rest = divmod(n, scale)
            return number_to_words(head) + [name] + (number_to_words(rest) if rest else [])
    raise AssertionError("unreachable")


def _year_to_words(n: int) -> list[str]:
    """Years are read in pairs: 1963 -> nineteen sixty three, 1905 -> nineteen oh five, 1900 -> nineteen hundred."""
    century, rest = divmod(n, 100)
    if rest == 0:
        return [*number_to_words(century), "hundred"]
    return number_to_words(century) + (["oh", _ONES[rest]] if rest < 10 else number_to_words(rest))


def _ordinal(word: str) -> str:
    if word in _IRREGULAR_ORDINALS:
        return _IRREGULAR_ORDINALS[word]
    return word[:-1] + "ieth" if word.endswith("y") else word + "th"


def _number_token_words(integer: str, decimals: str | None, ordinal: str | None) -> list[str]:
    n = int(integer.replace(",", ""))
    plain_integer = decimals is None and ordinal is None and "," not in integer
    words = _year_to_words(n) if plain_integer and 1100 <= n <= 1999 else number_to_words(n)
    if decimals is not None:
        words += ["point"] + [_ONES[int(digit)] for digit in decimals]
    if ordinal is not None:
        words[-1] = _ordinal(words[-1])
    return words


def _spoken_tokens(text: str) -> list[tuple[str, list[str]]]:
    """(written token, its spoken words) for every token of the lowercased text, in order."""
    tokens = []
    for match in _TOKEN.finditer(text.lower().replace("\u2019", "'")):
        integer, decimals, ordinal = match.groups()
        words = _number_token_words(integer, decimals, ordinal) if integer else [match.group()]
        tokens.append((match.group(), words))
    return tokens


def normalize_for_alignment(text: str) -> list[str]:
    """Lowercase spoken words: numbers spelled out, punctuation dropped, apostrophes inside words kept.

    Hyphenated and dotted forms split into words ("carving-knife" -> carving knife, "U.S." -> u s).
    """
    return [word for _, words in _spoken_tokens(text) for word in words]


def alphanumerics(text: str) -> str:
    """The lowercase letters and digits of `text`, the characters word times are spread over."""
    return "".join(c for c in text.lower() if c.isalnum())


def _spread(word: WordTime, count: int) -> list[float | None]:
    """Times for `count` characters sharing a word: each sits at the centre of an equal slice of [start, end]."""
    if not word.aligned or word.start is None or word.end is None:
        return [None] * count
    return [word.start + (i + 0.5) / count * (word.end - word.start) for i in range(count)]


def char_times_from_words(text: str, words: list[WordTime]) -> list[float | None]:
    """One time per alphanumeric character of `text.lower()`, from word times of normalize_for_alignment(text).

    A written token whose letters are its spoken word ("don't") spreads that word's span over its characters. A
    token that was rewritten ("19" -> nineteen, "1st" -> first) spreads the span from its first spoken word's start
    to its last one's end over its own characters. Characters of unaligned words get None.
    """
    tokens = _spoken_tokens(text)
    expected = [word for _, spoken in tokens for word in spoken]
    if [word.word for word in words] != expected:
        raise ValueError("words must be one WordTime per word of normalize_for_alignment(text), in order")
    times: list[float | None] = []
    remaining = iter(words)
    for written, spoken in tokens:
        group = [next(remaining) for _ in spoken]
        characters = alphanumerics(written)
        if characters == alphanumerics("".join(spoken)):
            for word in group:
                times += _spread(word, len(alphanumerics(word.word)))
        elif all(word.aligned for word in group):
            times += _spread(WordTime(written, group[0].start, group[-1].end, True), len(characters))
        else:
            times += [None] * len(characters)
    return times
