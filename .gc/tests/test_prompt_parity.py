"""build_prompt against the reference's prompt matrices, plus validation of reference codes."""

import pytest
import torch

from engine.errors import InputError
from engine.text.prompt import build_prompt
from engine.text.tokenizer import S1Tokenizer


@pytest.fixture(scope="module")
def tokenizer(s1_dir):
    return S1Tokenizer.from_dir(s1_dir)


@pytest.fixture(scope="module")
def references(s1_expected):
    return list(zip(s1_expected["prompt_b_ref_texts"], s1_expected["prompt_b_ref_codes"], strict=True))


def test_prompt_a_without_reference(tokenizer, s1_expected):
    prompt = build_prompt(tokenizer, s1_expected["prompt_a_text"])
    assert prompt.dtype == torch.int32
    assert torch.equal(prompt, s1_expected["prompt_a"])


def test_prompt_b_with_two_references(tokenizer, s1_expected, references):
    prompt = build_prompt(tokenizer, s1_expected["prompt_b_text"], references)
    assert prompt.dtype == torch.int32
    assert torch.equal(prompt, s1_expected["prompt_b"])


def test_int64_codes_give_the_same_prompt(tokenizer, s1_expected, references):
    widened = [(text, codes.long()) for text, codes in references]
    assert torch.equal(build_prompt(tokenizer, s1_expected["prompt_b_text"], widened), s1_expected["prompt_b"])


def test_frame_columns_layout(tokenizer, references):
    text, codes = references[0]
    prompt = build_prompt(tokenizer, "x", [(text, codes)])
    start = 1 + len(tokenizer.encode("<|speaker:0|>")) + len(tokenizer.encode(text))
    frames = prompt[:, start : start + codes.shape[1]]
    assert torch.equal(frames[0], codes[0] + tokenizer.semantic_begin_id)
    assert torch.equal(frames[1:], codes)
    assert prompt[0, start + codes.shape[1]] == tokenizer.im_end_id


def test_max_length(tokenizer, s1_expected):
    length = s1_expected["prompt_a"].shape[1]
    assert build_prompt(tokenizer, s1_expected["prompt_a_text"], max_length=length).shape[1] == length
    with pytest.raises(InputError, match="at most"):
        build_prompt(tokenizer, s1_expected["prompt_a_text"], max_length=length - 1)


@pytest.mark.parametrize(
    "codes, message",
    [
        (torch.zeros(9, 4, dtype=torch.int32), "shape"),
        (torch.zeros(10, dtype=torch.int32), "shape"),
        (torch.zeros(10, 0, dtype=torch.int32), "no frames"),
        (torch.zeros(10, 4), "integers"),
        ([[0] * 4] * 10, "torch.Tensor"),
        (torch.full((10, 4), 4096, dtype=torch.int32), "codebook 0"),
        (torch.cat([torch.zeros(1, 4), torch.full((9, 4), 1024)]).int(), "codebook 1"),
        (torch.full((10, 4), -1, dtype=torch.int32), "codebook 0"),
        (torch.cat([torch.zeros(7, 4), torch.full((1, 4), 1024), torch.full((2, 4), -3)]).int(),
         r"codebook 7 codes must be in \[0, 1024\), got values from 1024 to 1024"),  # the first bad row
    ],
)
def test_bad_reference_codes(tokenizer, codes, message):
    with pytest.raises(InputError, match=message):
        build_prompt(tokenizer, "text", [("ref", codes)])
