"""split_text: cut long text into chunks of at most `max_chars` characters for separate generation.

Whitespace is normalised first (every run becomes one space; line breaks count as sentence ends).
Chunks are whole sentences packed greedily; a sentence longer than `max_chars` is cut at clause
punctuation, then between words, and as a last resort inside a word. Nothing is dropped or
reordered: joining the chunks with a space, or with nothing where the text had no space at the cut
(CJK sentence ends, cuts inside a word), gives back the normalised text.
"""

from __future__ import annotations

import re
from typing import Callable, NamedTuple

from ..errors import InputError

_CLOSERS = "\"'”’»)）\\]」』"
# Latin ends need a following space (or the line end) so "3.14" and "U.S.A" stay whole.
_SENTENCE_END = re.compile(rf"[.!?…]+[{_CLOSERS}]*(?=\s|$)|[。！？]+[{_CLOSERS}]*")
_CLAUSE_END = re.compile(rf"[,;:]+[{_CLOSERS}]*(?=\s|$)|[，、；：]+[{_CLOSERS}]*")


class _Piece(NamedTuple):
    text: str  # no leading or trailing space
    space_before: bool  # whether the normalised text has a space just before this piece


def split_text(text: str, max_chars: int) -> list[str]:
    """Chunks of `text`, each 1..max_chars characters, in order; [] for blank text."""
    if not isinstance(max_chars, int) or max_chars < 1:
        raise InputError(f"max_chars must be a positive integer, got {max_chars!r}")
    pieces: list[_Piece] = []
    for line in text.splitlines():
        normalised = " ".join(line.split())
        if normalised:
            for sentence in _cut_after(_Piece(normalised, True), _SENTENCE_END):
                pieces.extend(_fit(sentence, max_chars))
    return [piece.text for piece in _pack(pieces, max_chars)]


def _fit(piece: _Piece, max_chars: int, level: int = 0) -> list[_Piece]:
    """`piece` broken into packed parts of at most max_chars, preferring the coarsest breaks.

    Each part is fitted and packed on its own before its neighbours are packed, so words of one
    clause only join a neighbouring clause when the whole packed group fits.
    """
    if len(piece.text) <= max_chars:
        return [piece]
    if level == len(_BREAKERS):
        return [
            _Piece(piece.text[start : start + max_chars], piece.space_before and start == 0)
            for start in range(0, len(piece.text), max_chars)
        ]
    parts = [packed for part in _BREAKERS[level](piece) for packed in _fit(part, max_chars, level + 1)]
    return _pack(parts, max_chars)


def _cut_after(piece: _Piece, pattern: re.Pattern) -> list[_Piece]:
    """`piece` cut just after every match of `pattern` (a match at the very end cuts nothing)."""
    text, parts, start = piece.text, [], 0
    for match in pattern.finditer(text):
        if start < match.end() < len(text):
            parts.append(text[start : match.end()])
            start = match.end()
    parts.append(text[start:])
    return [
        _Piece(part.strip(" "), piece.space_before if index == 0 else part.startswith(" "))
        for index, part in enumerate(parts)
    ]


def _words(piece: _Piece) -> list[_Piece]:
    words = piece.text.split(" ")
    return [_Piece(word, piece.space_before if index == 0 else True) for index, word in enumerate(words)]


_BREAKERS: list[Callable[[_Piece], list[_Piece]]] = [
    lambda piece: _cut_after(piece, _CLAUSE_END),
    _words,
]


def _pack(pieces: list[_Piece], max_chars: int) -> list[_Piece]:
    """Neighbouring pieces joined greedily while the result stays within max_chars."""
    packed: list[_Piece] = []
    for piece in pieces:
        if packed:
            last = packed[-1]
            joined = f"{last.text}{' ' if piece.space_before else ''}{piece.text}"
            if len(joined) <= max_chars:
                packed[-1] = _Piece(joined, last.space_before)
                continue
        packed.append(piece)
    return packed
