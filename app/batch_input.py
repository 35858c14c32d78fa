"""Texts for a batch run: an uploaded .txt (one per line) or .csv file's, then the typed lines."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from engine.errors import InputError

TEXT_COLUMN = "text"


def texts_from_lines(lines: str) -> list[str]:
    return [line.strip() for line in lines.splitlines() if line.strip()]


def texts_from_csv(content: str) -> list[str]:
    """The `text` column when the first row names one, otherwise the first column of every row."""
    rows = [row for row in csv.reader(io.StringIO(content)) if any(cell.strip() for cell in row)]
    if not rows:
        return []
    header = [cell.strip().lower() for cell in rows[0]]
    column = header.index(TEXT_COLUMN) if TEXT_COLUMN in header else None
    if column is None:
        return [row[0].strip() for row in rows if row[0].strip()]
    return [row[column].strip() for row in rows[1:] if len(row) > column and row[column].strip()]


def texts_from_file(path: str | Path) -> list[str]:
    path = Path(path)
    try:
        content = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise InputError(f"{path.name} is not UTF-8 text; save it as UTF-8 and upload it again") from None
    if path.suffix.lower() == ".csv":
        return texts_from_csv(content)
    if path.suffix.lower() == ".txt":
        return texts_from_lines(content)
    raise InputError(f"upload a .txt (one text per line) or .csv file, not {path.suffix or 'a file without extension'}")


def batch_texts(lines: str | None, file_path: str | None, limit: int) -> list[str]:
    """The file's texts (if one is given) followed by the typed lines: neither is dropped for the other."""
    texts = (texts_from_file(file_path) if file_path else []) + texts_from_lines(lines or "")
    if not texts:
        raise InputError("nothing to speak: type one text per line, or upload a .txt or .csv file")
    if len(texts) > limit:
        raise InputError(f"at most {limit} texts per batch; got {len(texts)}")
    return texts
