"""A compile helper's process (compile_helpers): `python -m engine.compile_helper_process PART CONFIG`
compiles PART's compiled regions in a small engine of CONFIG (JSON) and saves their packages."""

from __future__ import annotations

import dataclasses
import sys
import tempfile

from loguru import logger

from . import compiled_regions
from .compile_helpers import NAME_OFFSET, PARTS, config_from_json
from .config import EngineConfig
from .facade import TTSEngine


def run_part(part: str, config: EngineConfig) -> float:
    """An engine of `config` (the small one CompileHelpers.start made) compiles `part`'s regions and
    saves their packages into the store; only theirs (each region has one writer)."""
    if part not in PARTS:
        raise ValueError(f"unknown part {part!r}: one of {', '.join(PARTS)}")
    compiled_regions.store_only(PARTS[part], name_offset=(list(PARTS).index(part) + 1) * NAME_OFFSET)
    with tempfile.TemporaryDirectory(prefix="s1-compile-helper-") as voices:
        engine = TTSEngine.from_config(dataclasses.replace(config, voices_dir=voices))
        try:
            return engine.prepare_part(part)
        finally:
            engine.close()


def main(argv: list[str] | None = None) -> int:
    part, config = (argv if argv is not None else sys.argv[1:])
    seconds = run_part(part, config_from_json(config))
    logger.info("compile helper: the {} graphs compiled in {:.1f} s", part, seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
