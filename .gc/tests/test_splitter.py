"""split_text: boundaries, packing, fall-backs for long sentences, and faithfulness to the input."""

import random

import pytest

from engine.errors import InputError
from engine.text.splitter import split_text


def assert_faithful(text: str, chunks: list[str], max_chars: int):
    """Chunks are normalised, fit, and rebuild the normalised text with a space or nothing between."""
    normalised = " ".join(text.split())
    position = 0
    for index, chunk in enumerate(chunks):
        assert 1 <= len(chunk) <= max_chars, chunk
        assert chunk == " ".join(chunk.split()), f"chunk not whitespace-normalised: {chunk!r}"
        if index and normalised[position] == " ":
            position += 1
        assert normalised.startswith(chunk, position), f"chunk {index} {chunk!r} is not next in the text"
        position += len(chunk)
    assert position == len(normalised)


def split(text, max_chars):
    chunks = split_text(text, max_chars)
    assert_faithful(text, chunks, max_chars)
    return chunks


def test_short_text_is_one_chunk():
    assert split("Hello world. How are you?", 100) == ["Hello world. How are you?"]


def test_sentences_are_packed_greedily():
    text = "One two. Three four! Five six? Seven eight."
    assert split(text, 20) == ["One two. Three four!", "Five six?", "Seven eight."]


def test_newlines_are_sentence_boundaries_and_whitespace_is_normalised():
    text = "  First line without stop\n\n\tsecond   line \r\n third"
    assert split(text, 26) == ["First line without stop", "second line third"]


def test_ellipsis_and_closing_quotes_stay_with_their_sentence():
    assert split('He said "Stop!" Then… silence. Really?!', 16) == ['He said "Stop!"', "Then… silence.", "Really?!"]


def test_decimals_and_abbreviation_dots_do_not_split():
    assert split("Pi is 3.14159 today. The U.S.A. is big.", 20) == ["Pi is 3.14159 today.", "The U.S.A. is big."]


def test_cjk_sentences_split_without_spaces():
    text = "你好，世界！今天天气很好。我们去公园吧？"
    assert split(text, 8) == ["你好，世界！", "今天天气很好。", "我们去公园吧？"]


def test_cjk_long_sentence_splits_at_clause_marks():
    text = "我们今天早上，一起去了公园、动物园；然后回家吃饭。"
    chunks = split(text, 8)
    assert chunks == ["我们今天早上，", "一起去了公园、", "动物园；", "然后回家吃饭。"]


def test_long_sentence_splits_at_clauses_then_words():
    text = "When the rain stopped, the children ran outside; they played until the sun went down."
    chunks = split(text, 30)
    assert chunks == ["When the rain stopped,", "the children ran outside;", "they played until the sun went", "down."]


def test_numbers_with_commas_are_not_clause_breaks():
    assert split("It costs 1,000,000 dollars now", 12) == ["It costs", "1,000,000", "dollars now"]


def test_overlong_word_is_hard_cut():
    word = "a" * 25
    assert split(f"x {word} y", 10) == ["x", "a" * 10, "a" * 10, "a" * 5 + " y"]


def test_no_spaces_no_punctuation_is_hard_cut():
    assert split("abcdefghij" * 3, 7) == ["abcdefg", "hijabcd", "efghija", "bcdefgh", "ij"]


@pytest.mark.parametrize("text", ["", "   ", "\n\n\t \r\n", "\u3000\xa0"])
def test_blank_text_gives_no_chunks(text):
    assert split_text(text, 10) == []


def test_punctuation_only_and_max_chars_one():
    assert split("?!. ...", 1) == ["?", "!", ".", ".", ".", "."]


def test_unusual_whitespace_is_normalised():
    assert split("x\xa0y\u3000z\u2028w", 100) == ["x y z w"]


@pytest.mark.parametrize("max_chars", [0, -5, 2.5, None])
def test_bad_max_chars(max_chars):
    with pytest.raises(InputError, match="max_chars"):
        split_text("text", max_chars)


def test_random_texts_are_split_faithfully():
    rng = random.Random(0)
    alphabet = list("abc xyz,.;:!?…。！？，、；\n\t\"'”) 你好123") + ["  ", "... ", "Mr. "]
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 200)))
        split(text, rng.randint(1, 40))


def test_large_text_is_fast_and_faithful():
    text = "This is a sentence, with a clause. " * 20_000  # 700,000 characters
    chunks = split(text, 200)
    assert len(chunks) > 3000
