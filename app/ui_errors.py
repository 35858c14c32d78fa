"""How the UI's actions report errors: the page's event writes them next to the control that caused
them (ui_action), the public API event raises them for gradio_client (api_endpoint). Either way a
caller's mistake is logged as one line and a real fault with its traceback."""

from __future__ import annotations

import functools
import inspect
import logging

import gradio as gr

from .errors import problem_for
from .metrics import Metrics

log = logging.getLogger("app.ui")


def _report(e: Exception, route: str, metrics: Metrics) -> str:
    """Counts the failure and logs it: one line for a caller's mistake, a traceback (in
    problem_for) only for a real fault. Returns the message to show."""
    problem = problem_for(e)
    metrics.observe_request(route, problem.status, problem.kind)
    if problem.status < 500:
        log.info("%s refused (%d): %s", route, problem.status, problem.message)
    return problem.message


def error_box(message: str | None = None):
    """The message shown under the control that failed; hidden when there is none."""
    if not message:
        return gr.Markdown(value="", visible=False)
    return gr.Markdown(value=f"{message[:1].upper()}{message[1:]}", visible=True)


def api_endpoint(fn, route: str, metrics: Metrics):
    """For gradio_client: errors raise as readable messages (never a stack trace).

    Gradio looks at the handler to decide whether it streams, so generators stay generators.
    """

    def fail(e: Exception):
        return gr.Error(_report(e, route, metrics), print_exception=False)

    if inspect.isgeneratorfunction(fn):

        @functools.wraps(fn)
        def stream(*args, **kwargs):
            try:
                yield from fn(*args, **kwargs)
            except Exception as e:
                raise fail(e) from None
            metrics.observe_request(route, 200)

        return stream

    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            result = fn(*args, **kwargs)
        except Exception as e:
            raise fail(e) from None
        metrics.observe_request(route, 200)
        return result

    return call


def ui_action(fn, route: str, metrics: Metrics, outputs: int, *, status_first: bool = False):
    """For the page: `fn`'s outputs plus an error box, which an error fills (the other outputs keep
    their values, except a status message in the first one, which is cleared) and the next run clears."""

    def as_tuple(result):
        return result if outputs > 1 else (result,)

    def failed(e: Exception):
        kept = ["" if status_first and i == 0 else gr.skip() for i in range(outputs)]
        return (*kept, error_box(_report(e, route, metrics)))

    if inspect.isgeneratorfunction(fn):

        def stream(*args):
            yield (*[gr.skip()] * outputs, error_box())
            try:
                for result in fn(*args):
                    yield (*as_tuple(result), gr.skip())
            except Exception as e:
                yield failed(e)
                return
            metrics.observe_request(route, 200)

        return stream

    def call(*args):
        try:
            result = fn(*args)
        except Exception as e:
            return failed(e)
        metrics.observe_request(route, 200)
        return (*as_tuple(result), error_box())

    return call


# ----- small helpers ------------------------------------------------------------------------------
