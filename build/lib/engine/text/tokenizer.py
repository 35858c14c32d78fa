"""S1Tokenizer: the S1-mini text tokenizer (tiktoken BPE + named special tokens).

Reproduces the reference tokenizer exactly (s1-mini.md §5): the same split pattern, special-token
ids assigned by position after the BPE ranks, literal special-token text turned into special ids,
and 400,000-character encoding chunks.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from os import PathLike
from pathlib import Path

import tiktoken

from ..errors import CheckpointError

TOKENIZER_FILE = "tokenizer.tiktoken"
SPECIAL_TOKENS_FILE = "special_tokens.json"

# The reference split pattern, alternatives in order. Alternative 7 is an upstream quirk kept on
# purpose: `(\?!\S)` is a group matching a literal "?!" then a non-space, not a negative lookahead.
SPLIT_PATTERN = "|".join(
    [
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)",
        r"\p{P}",
        r"[^\r\n\p{L}\p{N}]?\p{L}+",
        r"\p{N}",
        r" ?[^\s\p{L}\p{N}]+[\r\n]*",
        r"\s*[\r\n]+",
        r"\s+(\?!\S)",
        r"\s+",
    ]
)

ENCODE_CHUNK_CHARS = 400_000  # the reference encodes in chunks of this many characters
# The shape of S1's special tokens ("<|im_end|>", "<|semantic:7|>"). tiktoken copies the allowed
# special tokens into a new set on every call: all 4,111 of them cost ~0.5 ms per encode (a
# request's set-up encodes twice, on the GPU worker's thread), so encode passes only those written
# in the text, found by this pattern.
SPECIAL_SHAPE = re.compile(r"<\|[^|]*\|>")

IM_END = "<|im_end|>"
INTERLEAVE = "<|interleave|>"
NUM_SEMANTIC_TOKENS = 4096


def semantic_token(code: int) -> str:
    return f"<|semantic:{code}|>"


class S1Tokenizer:
    def __init__(self, mergeable_ranks: dict[bytes, int], special_tokens: dict[str, int]):
        self._num_ranks = len(mergeable_ranks)
        self._special = dict(special_tokens)
        for name in (IM_END, INTERLEAVE, semantic_token(0), semantic_token(NUM_SEMANTIC_TOKENS - 1)):
            if name not in self._special:
                raise CheckpointError(f"the tokenizer has no special token {name}; the checkpoint is incomplete")
        self._encoding = tiktoken.Encoding(
            name="s1-tokenizer",
            pat_str=SPLIT_PATTERN,
            mergeable_ranks=mergeable_ranks,
            special_tokens=self._special,
        )
        # A special token of another shape could be missed by SPECIAL_SHAPE: then allow them all.
        self._specials_found_by_shape = all(SPECIAL_SHAPE.fullmatch(name) for name in self._special)

    @classmethod
    def from_dir(cls, path: str | PathLike) -> "S1Tokenizer":
        """Load `tokenizer.tiktoken` and `special_tokens.json` from a checkpoint directory."""
        root = Path(path)
        ranks = _read_ranks(root / TOKENIZER_FILE)
        special = _read_special_tokens(root / SPECIAL_TOKENS_FILE, num_ranks=len(ranks))
        return cls(ranks, special)

    # ---- sizes and ids -------------------------------------------------------------------------

    @property
    def num_ranks(self) -> int:
        """Number of BPE ranks; the first special token's id."""
        return self._num_ranks

    @property
    def special_tokens(self) -> dict[str, int]:
        return dict(self._special)

    @property
    def im_end_id(self) -> int:
        return self._special[IM_END]

    @property
    def interleave_id(self) -> int:
        return self._special[INTERLEAVE]

    @property
    def semantic_begin_id(self) -> int:
        return self._special[semantic_token(0)]

    @property
    def semantic_end_id(self) -> int:
        return self._special[semantic_token(NUM_SEMANTIC_TOKENS - 1)]

    def token_id(self, name: str) -> int:
        """Id of a named special token, e.g. "<|im_end|>"."""
        try:
            return self._special[name]
        except KeyError:
            raise KeyError(f"{name!r} is not a special token of this tokenizer") from None

    def semantic_id(self, code: int) -> int:
        """Vocabulary id of semantic code `code` (codebook 0), 0 <= code < 4096."""
        if not 0 <= code < NUM_SEMANTIC_TOKENS:
            raise ValueError(f"semantic code must be in [0, {NUM_SEMANTIC_TOKENS}), got {code}")
        return self.semantic_begin_id + code

    # ---- text ----------------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """BPE ids of `text`; special-token text written literally becomes its special id."""
        ids: list[int] = []
        for start in range(0, len(text), ENCODE_CHUNK_CHARS):
            chunk = text[start : start + ENCODE_CHUNK_CHARS]
            if self._specials_found_by_shape:
                allowed = {name for name in SPECIAL_SHAPE.findall(chunk) if name in self._special}
            else:
                allowed = "all"
            ids.extend(self._encoding.encode(chunk, allowed_special=allowed, disallowed_special=()))
        return ids

    def decode(self, ids: list[int]) -> str:
        """Text of `ids` (for debugging; invalid UTF-8 is replaced)."""
        return self._encoding.decode(list(ids), errors="replace")


def _read_ranks(path: Path) -> dict[bytes, int]:
    if not path.is_file():
        raise CheckpointError(f"tokenizer file not found: {path}; the checkpoint directory is incomplete")
    ranks: dict[bytes, int] = {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"cannot read {path}: {exc}") from exc
    for line_no, line in enumerate(lines, 1):
        parts = line.split()
        if not parts:
            continue
        if parts[0] == "=":  # the reference skips a token written as "=" (empty bytes)
            continue
        try:
            token_b64, rank = parts
            ranks[base64.b64decode(token_b64, validate=True)] = int(rank)
        except (ValueError, binascii.Error) as exc:
            raise CheckpointError(
                f"{path} line {line_no} is not '<base64 token> <rank>': {line[:80]!r}; "
                "the tokenizer file is corrupt, download the checkpoint again"
            ) from exc
    if not ranks:
        raise CheckpointError(f"{path} holds no tokens; download the checkpoint again")
    return ranks


def _read_special_tokens(path: Path, num_ranks: int) -> dict[str, int]:
    if not path.is_file():
        raise CheckpointError(f"special tokens file not found: {path}; the checkpoint directory is incomplete")
    try:
        written = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"cannot parse {path}: {exc}; download the checkpoint again") from exc
    if not isinstance(written, dict) or not written:
        raise CheckpointError(f"{path} must be a non-empty JSON object {{token: id}}")
    # The reference ignores the written ids and assigns num_ranks + position; check they agree so
    # that a mismatched tokenizer/special-token pair is caught at load time, not as garbled speech.
    special = {token: num_ranks + index for index, token in enumerate(written)}
    wrong = [(token, written[token], special[token]) for token in written if written[token] != special[token]]
    if wrong:
        token, file_id, derived = wrong[0]
        raise CheckpointError(
            f"{path} does not match {TOKENIZER_FILE}: {len(wrong)} special token ids differ from "
            f"num_ranks ({num_ranks}) + position, e.g. {token} is {file_id} in the file but {derived} by "
            "position; the two tokenizer files come from different checkpoints"
        )
    return special
