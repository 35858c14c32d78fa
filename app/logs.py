"""One log stream: the standard logging of uvicorn, Gradio and the app goes through loguru, which
the engine already uses."""

from __future__ import annotations

import logging
import sys

from loguru import logger


class _ToLoguru(logging.Handler):
    def emit(self, record: logging.LogRecord):
        try:
            level = logger.level(record.levelname).name
        except ValueError:
            level = record.levelno
        logger.opt(depth=6, exception=record.exc_info).log(level, record.getMessage())


def route_std_logging_to_loguru(level: int = logging.INFO):
    """Also replaces loguru's default sink by one without `diagnose`: that one prints the values of
    the variables in every traceback frame, secrets (the API key) and request data included."""
    logger.remove()
    logger.add(sys.stderr, diagnose=False)
    logging.basicConfig(handlers=[_ToLoguru()], level=level, force=True)
