"""S1Tokenizer against the reference tokenizer's golden ids, plus loader error handling."""

import json
import shutil

import pytest
import regex  # a tiktoken dependency

from engine.errors import CheckpointError
from engine.text.tokenizer import SPLIT_PATTERN, S1Tokenizer


@pytest.fixture(scope="module")
def tokenizer(s1_dir):
    return S1Tokenizer.from_dir(s1_dir)


def test_every_golden_case_matches(tokenizer, s1_expected):
    texts, expected_ids = s1_expected["tokenizer_texts"], s1_expected["tokenizer_ids"]
    assert len(texts) == len(expected_ids) > 0
    for text, ids in zip(texts, expected_ids, strict=True):
        assert tokenizer.encode(text) == list(ids), f"mismatch for {text!r}"


def test_special_ids_match(tokenizer, s1_expected):
    special = s1_expected["special_ids"]
    assert tokenizer.num_ranks == special["num_ranks"]
    assert tokenizer.im_end_id == special["im_end"] == tokenizer.token_id("<|im_end|>")
    assert tokenizer.interleave_id == special["interleave"] == tokenizer.token_id("<|interleave|>")
    assert tokenizer.semantic_begin_id == special["semantic_begin"] == tokenizer.semantic_id(0)
    assert tokenizer.semantic_end_id == special["semantic_end"] == tokenizer.semantic_id(4095)
    assert tokenizer.token_id("<|begin_of_text|>") == tokenizer.num_ranks


def test_literal_special_text_becomes_special_id(tokenizer):
    assert tokenizer.encode("<|semantic:7|>") == [tokenizer.semantic_id(7)]
    assert tokenizer.encode("a<|im_end|>")[-1] == tokenizer.im_end_id


@pytest.mark.parametrize("text", ["a<|im_end|>b<|semantic:5|>", "<|x<|im_end|>", "<|semantic:5|><|semantic:5|>c",
                                  "<|speaker:0|> hi <|interleave|>", "<|im_end", "|> <|> <||>", "plain text only"])
def test_encode_equals_tiktoken_with_every_special_token_allowed(tokenizer, text):
    """encode passes tiktoken only the special tokens written in the text (see SPECIAL_SHAPE)."""
    assert tokenizer.encode(text) == tokenizer._encoding.encode(text, allowed_special="all", disallowed_special=())


def test_speaker_tag_is_plain_bpe(tokenizer):
    ids = tokenizer.encode("<|speaker:0|>")
    assert len(ids) > 1 and all(i < tokenizer.num_ranks for i in ids)


def test_escaped_question_bang_quirk():
    # Alternative 7 is a group matching a literal "?!" (not a look-ahead): whitespace + "?!" + a
    # non-space is one piece, and a whitespace run before a word is taken whole.
    pieces = [m.group(0) for m in regex.finditer(SPLIT_PATTERN, "odd  ?!x and  word")]
    assert pieces == ["odd", "  ?!x", " and", "  ", "word"]


def test_decode_round_trips(tokenizer):
    text = "Hello, world! 你好 <|im_end|>"
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_long_text_is_chunked_like_the_reference(tokenizer):
    text = "ab " * 140_000  # 420,000 chars: crosses the 400,000-char chunk boundary
    ids = tokenizer.encode(text)
    boundary = 400_000
    expected = tokenizer.encode(text[:boundary]) + tokenizer.encode(text[boundary:])
    assert ids == expected


def test_semantic_id_range(tokenizer):
    with pytest.raises(ValueError):
        tokenizer.semantic_id(4096)
    with pytest.raises(KeyError):
        tokenizer.token_id("<|nope|>")


def _copy_checkpoint(s1_dir, tmp_path):
    for name in ("tokenizer.tiktoken", "special_tokens.json"):
        shutil.copy(s1_dir / name, tmp_path / name)
    return tmp_path


def test_missing_files(s1_dir, tmp_path):
    with pytest.raises(CheckpointError, match="tokenizer file not found"):
        S1Tokenizer.from_dir(tmp_path)
    shutil.copy(s1_dir / "tokenizer.tiktoken", tmp_path)
    with pytest.raises(CheckpointError, match="special tokens file not found"):
        S1Tokenizer.from_dir(tmp_path)


def test_blank_lines_and_equals_token_are_skipped(s1_dir, tmp_path):
    root = _copy_checkpoint(s1_dir, tmp_path)
    path = root / "tokenizer.tiktoken"
    path.write_text("\n" + path.read_text() + "\n\n")
    assert S1Tokenizer.from_dir(root).num_ranks == S1Tokenizer.from_dir(s1_dir).num_ranks


def test_corrupt_ranks_file(s1_dir, tmp_path):
    root = _copy_checkpoint(s1_dir, tmp_path)
    (root / "tokenizer.tiktoken").write_text("IQ== 0\nnot base64!! x\n")
    with pytest.raises(CheckpointError, match="line 2"):
        S1Tokenizer.from_dir(root)


def test_corrupt_special_tokens_json(s1_dir, tmp_path):
    root = _copy_checkpoint(s1_dir, tmp_path)
    (root / "special_tokens.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="cannot parse"):
        S1Tokenizer.from_dir(root)


def test_special_ids_disagreeing_with_ranks(s1_dir, tmp_path):
    root = _copy_checkpoint(s1_dir, tmp_path)
    path = root / "special_tokens.json"
    special = json.loads(path.read_text())
    path.write_text(json.dumps({token: i + 1 for token, i in special.items()}))
    with pytest.raises(CheckpointError, match="different checkpoints"):
        S1Tokenizer.from_dir(root)


def test_missing_required_special_token(s1_dir, tmp_path):
    root = _copy_checkpoint(s1_dir, tmp_path)
    path = root / "special_tokens.json"
    special = json.loads(path.read_text())
    path.write_text(json.dumps({t: i for t, i in special.items() if t != "<|semantic:4095|>"}))
    with pytest.raises(CheckpointError, match="semantic:4095"):
        S1Tokenizer.from_dir(root)
