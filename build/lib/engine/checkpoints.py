"""Find, download and verify a checkpoint directory.

A checkpoint is a local directory or a Hugging Face repo id. Downloads go through huggingface-hub
into its standard cache, which honours HF_TOKEN, HF_HOME and HF_HUB_OFFLINE by itself.
"""

from __future__ import annotations

import json
from pathlib import Path

from loguru import logger

from .config import DEFAULT_LOCAL_CHECKPOINT, DEFAULT_REPO_ID
from .errors import CheckpointError

REQUIRED_FILES = ("config.json", "model.pth", "tokenizer.tiktoken", "special_tokens.json", "codec.pth")
OPTIONAL_FILES = ("codec_config.json",)
DEMO_DIR = Path(__file__).resolve().parent.parent / "assets" / "demo"
MODEL_PAGE = f"https://huggingface.co/{DEFAULT_REPO_ID}"

HOW_TO_GET_WEIGHTS = (
    f"To get the real weights: accept the licence on {MODEL_PAGE} (the repo is gated), then either "
    "set HF_TOKEN (or run `hf auth login`) and let the app download them, or download them yourself with "
    f"`hf download {DEFAULT_REPO_ID} --local-dir {DEFAULT_LOCAL_CHECKPOINT}`. "
    "To try the app without them, start it with --demo (a tiny random model that produces noise)."
)


def resolve_checkpoint(spec: str | None) -> Path:
    """Return a verified local directory for `spec` (None: ./checkpoints/openaudio-s1-mini, else the hub)."""
    if spec is None:
        spec = str(DEFAULT_LOCAL_CHECKPOINT) if DEFAULT_LOCAL_CHECKPOINT.is_dir() else DEFAULT_REPO_ID
    path = Path(spec).expanduser()
    if path.is_dir():
        verify_checkpoint_dir(path)
        return path
    if _looks_like_repo_id(spec):
        path = download_checkpoint(spec)
        verify_checkpoint_dir(path)
        return path
    raise CheckpointError(f"checkpoint {spec!r} is neither a directory nor a Hugging Face repo id. " + HOW_TO_GET_WEIGHTS)


def _looks_like_repo_id(spec: str) -> bool:
    parts = spec.split("/")
    return len(parts) == 2 and all(parts) and not spec.startswith((".", "~")) and "\\" not in spec


def download_checkpoint(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError,
    )

    logger.info("fetching {} from the Hugging Face hub (cached after the first time)", repo_id)
    try:
        return Path(snapshot_download(repo_id, allow_patterns=list(REQUIRED_FILES + OPTIONAL_FILES)))
    except GatedRepoError:
        raise CheckpointError(
            f"{repo_id} is gated and this machine is not authorised to download it. " + HOW_TO_GET_WEIGHTS
        ) from None
    except RepositoryNotFoundError:
        raise CheckpointError(
            f"{repo_id} was not found on the hub (or it is private and no valid token is set). " + HOW_TO_GET_WEIGHTS
        ) from None
    except LocalEntryNotFoundError:
        raise CheckpointError(
            f"{repo_id} is not in the local Hugging Face cache and the hub cannot be reached (no network, or "
            "HF_HUB_OFFLINE=1). " + HOW_TO_GET_WEIGHTS
        ) from None
    except (HfHubHTTPError, OSError) as exc:
        raise CheckpointError(f"downloading {repo_id} failed: {exc}. " + HOW_TO_GET_WEIGHTS) from None


def verify_checkpoint_dir(path: Path) -> None:
    """Files present and config readable; tensor names and shapes are checked when loading."""
    missing = [name for name in REQUIRED_FILES if not (path / name).is_file()]
    if missing:
        raise CheckpointError(
            f"checkpoint directory {path} lacks {', '.join(missing)}. An S1-mini checkpoint holds "
            f"{', '.join(REQUIRED_FILES)}. " + HOW_TO_GET_WEIGHTS
        )
    empty = [name for name in REQUIRED_FILES if (path / name).stat().st_size == 0]
    if empty:
        raise CheckpointError(f"{', '.join(empty)} in {path} are empty (an interrupted download?); download them again")
    try:
        json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path / 'config.json'} is not valid JSON ({exc}); download it again") from None
