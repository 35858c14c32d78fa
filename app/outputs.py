"""Where the UI writes files it offers for download (WAVs, zips).

Gradio only serves returned files from the temp dir, the cwd or allowed paths, and copies them
into its own cache; so outputs go under the system temp dir and old runs are pruned.
"""

from __future__ import annotations

import shutil
import tempfile
import time
import uuid
import zipfile
from pathlib import Path

KEEP_SECONDS = 3600


class OutputDir:
    def __init__(self, root: Path | None = None):
        self.root = root or Path(tempfile.gettempdir()) / "s1-mini-studio"

    def new_run(self) -> Path:
        self._prune()
        run = self.root / uuid.uuid4().hex[:12]
        run.mkdir(parents=True)
        return run

    def resolve(self, name: str) -> Path | None:
        """The file `<run>/<file>` under this folder if it still exists. `name` comes from the
        browser, so anything else (other folders, `..`, absolute paths) is None."""
        parts = Path(name).parts if isinstance(name, str) else ()
        if len(parts) != 2 or any(p in ("", ".", "..") or "/" in p or "\\" in p for p in parts):
            return None
        path = self.root / parts[0] / parts[1]
        return path if path.is_file() and path.resolve().parent.parent == self.root.resolve() else None

    def _prune(self):
        if not self.root.is_dir():
            return
        cutoff = time.time() - KEEP_SECONDS
        for run in self.root.iterdir():
            if run.is_dir() and run.stat().st_mtime < cutoff:
                shutil.rmtree(run, ignore_errors=True)


def write_file(folder: Path, name: str, data: bytes) -> Path:
    path = folder / name
    path.write_bytes(data)
    return path


def zip_files(paths: list[Path], zip_path: Path) -> Path:
    # Audio is already compressed or barely compressible: store, do not deflate.
    with zipfile.ZipFile(zip_path, "w", compression=zipfile.ZIP_STORED) as archive:
        for path in paths:
            archive.write(path, arcname=path.name)
    return zip_path
