"""launch.py (app/launcher.py): flags, environment fallbacks, deployment defaults, clear start-up errors, and a
start with no network at all."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import textwrap
import threading

import httpx
import pytest

from app import launcher as launch
from tests.test_app_support import ROOT, DemoServer, assert_audio

FLAGS = [
    "--checkpoint",
    "--demo",
    "--random-weights",
    "--device",
    "--precision",
    "--compile",
    "--no-compile",
    "--quantize",
    "--listen",
    "--root-path",
    "--api-key",
    "--share",
    "--max-batch-size",
    "--max-text-length",
    "--no-ui",
]


def parse(*argv):
    return launch.build_parser().parse_args(list(argv))


def run_launch(*argv, env=None, timeout=60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "launch.py", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def test_help_explains_every_flag_and_its_variable():
    out = run_launch("--help").stdout
    for flag in FLAGS:
        assert flag in out, flag
    for variable in (
        "S1_MINI_CHECKPOINT",
        "S1_MINI_DEMO",
        "S1_MINI_DEVICE",
        "S1_MINI_PRECISION",
        "S1_MINI_COMPILE",
        "S1_MINI_QUANTIZE",
        "S1_MINI_LISTEN",
        "GRADIO_SERVER_NAME",
        "S1_MINI_ROOT_PATH",
        "S1_MINI_API_KEY",
        "S1_MINI_SHARE",
        "S1_MINI_MAX_BATCH_SIZE",
        "S1_MINI_MAX_TEXT_LENGTH",
        "RUNPOD_POD_ID",
    ):
        assert variable in out, variable


@pytest.mark.parametrize(
    "text, expected",
    [
        ("127.0.0.1:7860", ("127.0.0.1", 7860)),
        ("0.0.0.0:80", ("0.0.0.0", 80)),
        ("[::1]:9000", ("::1", 9000)),
        (":8000", ("127.0.0.1", 8000)),
        ("localhost:7861", ("localhost", 7861)),
    ],
)
def test_parse_listen(text, expected):
    assert launch.parse_listen(text) == expected


@pytest.mark.parametrize("text", ["7860", "host:", "host:http", "host:70000", "host:0"])
def test_parse_listen_rejects_nonsense(text):
    with pytest.raises(ValueError, match="--listen"):
        launch.parse_listen(text)


def test_server_defaults_to_this_machine_only():
    plan = launch.plan_server(parse(), {})
    assert (plan.host, plan.port, plan.root_path, plan.api_key, plan.share) == ("127.0.0.1", 7860, "", None, False)


def test_gradio_variables_are_honoured_and_flags_win():
    env = {"GRADIO_SERVER_NAME": "0.0.0.0", "GRADIO_SERVER_PORT": "8080", "GRADIO_ROOT_PATH": "/tts"}
    plan = launch.plan_server(parse(), env)
    assert (plan.host, plan.port, plan.root_path) == ("0.0.0.0", 8080, "/tts")
    plan = launch.plan_server(
        parse("--listen", "127.0.0.1:9000", "--root-path", "/x"), {**env, "S1_MINI_LISTEN": "1.2.3.4:1"}
    )
    assert (plan.host, plan.port, plan.root_path) == ("127.0.0.1", 9000, "/x")
    assert launch.plan_server(parse(), {**env, "S1_MINI_LISTEN": "0.0.0.0:7000"}).port == 7000
    # ":PORT" keeps the host the server takes without it: the image's 0.0.0.0, a pod's, a Space's
    for environ, host in ((env, "0.0.0.0"), ({"RUNPOD_POD_ID": "abc123"}, "0.0.0.0"), ({}, "127.0.0.1")):
        plan = launch.plan_server(parse("--listen", ":9000"), environ)
        assert (plan.host, plan.port) == (host, 9000)


def test_runpod_listens_everywhere_with_the_proxy_url_as_root():
    plan = launch.plan_server(parse("--listen", "0.0.0.0:8000"), {"RUNPOD_POD_ID": "abc123"})
    assert plan.root_path == "https://abc123-8000.proxy.runpod.net"
    plan = launch.plan_server(parse(), {"RUNPOD_POD_ID": "abc123"})
    assert (plan.host, plan.port, plan.root_path) == ("0.0.0.0", 7860, "https://abc123-7860.proxy.runpod.net")


def test_space_listens_everywhere_on_7860():
    plan = launch.plan_server(parse(), {"SPACE_ID": "me/s1-mini"})
    assert (plan.host, plan.port, plan.root_path) == ("0.0.0.0", 7860, "")


def test_runpod_keeps_caches_on_the_workspace_volume(tmp_path):
    env = {"RUNPOD_POD_ID": "abc123", "HF_HOME": "/mine"}
    found = launch.runpod_storage_defaults(env, workspace=str(tmp_path))
    assert found == {
        "S1_MINI_CACHE_DIR": f"{tmp_path}/s1-mini/cache",
        "S1_MINI_VOICES_DIR": f"{tmp_path}/s1-mini/voices",
    }
    assert launch.runpod_storage_defaults({}, workspace=str(tmp_path)) == {}
    assert launch.runpod_storage_defaults(env, workspace=str(tmp_path / "missing")) == {}


def test_api_key_and_share_from_the_environment():
    plan = launch.plan_server(parse(), {"S1_MINI_API_KEY": "k", "S1_MINI_SHARE": "true"})
    assert plan.api_key == "k" and plan.share is True
    assert launch.plan_server(parse("--share"), {"SPACE_ID": "me/space"}).share is False


def test_random_weights_flag_and_variable_reach_the_engine_config():
    assert launch.engine_config(parse("--random-weights"), {}).random_weights is True
    assert launch.engine_config(parse(), {"S1_MINI_RANDOM_WEIGHTS": "1"}).random_weights is True
    assert launch.engine_config(parse(), {}).random_weights is False


def test_engine_settings_from_flags_then_environment():
    env = {"S1_MINI_DEMO": "1", "S1_MINI_PRECISION": "fp16", "S1_MINI_COMPILE": "off", "S1_MINI_MAX_TEXT_LENGTH": "50"}
    config = launch.engine_config(parse(), env)
    assert (config.demo, config.precision, config.compile, config.max_text_length) == (True, "fp16", "off", 50)
    config = launch.engine_config(parse("--precision", "bf16", "--compile", "--max-text-length", "9"), env)
    assert (config.precision, config.compile, config.max_text_length) == ("bf16", "on", 9)
    config = launch.engine_config(
        parse("--no-compile", "--quantize", "int8", "--max-batch-size", "4", "--device", "cpu"), {}
    )
    assert (config.compile, config.quantize, config.max_batch_size, config.device) == ("off", "int8", 4, "cpu")
    assert launch.engine_config(parse(), {}).compile == "auto"


@pytest.mark.parametrize(
    "argv, env, words",
    [
        (["--precision", "fp64"], {}, "invalid choice"),
        (["--listen", "nowhere"], {}, "--listen must look like"),
        (["--demo"], {"S1_MINI_DEVICE": "tpu"}, "device must be one of"),
        (["--demo"], {"S1_MINI_MAX_BATCH_SIZE": "many"}, "must be a number"),
        (["--demo", "--max-text-length", "-1"], {}, "max_text_length"),
    ],
)
def test_bad_settings_stop_with_a_clear_message(argv, env, words):
    result = run_launch(*argv, env=env)
    assert result.returncode == 2
    assert words in result.stderr + result.stdout
    assert "Traceback" not in result.stderr


def test_a_taken_port_is_reported_before_loading_the_model():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_launch("--demo", "--listen", f"127.0.0.1:{port}")
    assert result.returncode != 0
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr
    assert "Traceback" not in result.stderr


OFFLINE_CHECK = textwrap.dedent(
    """
    import tempfile
    from pathlib import Path
    import httpx
    from tests.test_app_support import DemoServer, assert_audio
    # HF_HUB_OFFLINE=0: the start must not depend on being told that there is no network.
    with DemoServer(Path(tempfile.mkdtemp()), env={"HF_HUB_OFFLINE": "0"}) as server:
        assert httpx.get(server.url + "/ready").status_code == 200
        assert "<html" in httpx.get(server.url + "/").text.lower()
        r = httpx.post(server.url + "/v1/tts", json={"text": "Offline.", "max_new_tokens": 8}, timeout=60)
        assert_audio(r.content, min_seconds=0.1)
    print("OFFLINE-OK")
    """
)


@pytest.mark.skipif(
    shutil.which("unshare") is None or shutil.which("ip") is None, reason="needs unshare and ip (util-linux, iproute2)"
)
def test_demo_starts_and_speaks_with_no_network_at_all():
    command = f"ip link set lo up && exec {sys.executable} -c '{OFFLINE_CHECK}'"
    try:
        result = subprocess.run(
            ["unshare", "--net", "sh", "-c", command], cwd=ROOT, capture_output=True, text=True, timeout=180
        )
    except PermissionError:
        pytest.skip("not allowed to create a network namespace here")
    if "Operation not permitted" in result.stderr and "OFFLINE-OK" not in result.stdout:
        pytest.skip("not allowed to create a network namespace here")
    assert "OFFLINE-OK" in result.stdout, result.stderr[-3000:]


def test_no_ui_plan_and_its_conflict_with_share():
    assert launch.plan_server(parse(), {}).ui is True
    plan = launch.plan_server(parse("--no-ui"), {})
    assert plan.ui is False and any("REST API only" in r for r in plan.reasons)
    assert launch.plan_server(parse(), {"S1_MINI_NO_UI": "1"}).ui is False
    with pytest.raises(ValueError, match="--share"):
        launch.plan_server(parse("--no-ui", "--share"), {})


@pytest.mark.parametrize("name,raw", [("S1_MINI_NO_UI", "maybe"), ("S1_MINI_SHARE", "ture")])
def test_an_on_off_variable_that_is_neither_stops_the_start(name, raw):
    assert launch.plan_server(parse(), {name: "off"}).ui is True
    with pytest.raises(ValueError, match=f"{name} must be true or false.*{raw}"):
        launch.plan_server(parse(), {name: raw})


def test_drain_seconds_that_are_not_a_number_name_the_setting():
    assert launch.plan_server(parse(), {"S1_MINI_DRAIN_SECONDS": "7.5"}).drain_s == 7.5
    with pytest.raises(ValueError, match=r"S1_MINI_DRAIN_SECONDS\) must be a number of seconds, got 'abc'"):
        launch.plan_server(parse(), {"S1_MINI_DRAIN_SECONDS": "abc"})


def test_api_only_server_runs_without_gradio_installed(tmp_path):
    """--no-ui on a machine without Gradio (an import of it fails here): the REST API serves, and /
    sends a browser to the API docs."""
    blocker = tmp_path / "no-gradio" / "gradio"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('gradio is blocked in this test')\n")
    path = os.pathsep.join(filter(None, [str(blocker.parent), os.environ.get("PYTHONPATH")]))
    with DemoServer(tmp_path, "--no-ui", env={"PYTHONPATH": path}) as server:
        r = httpx.post(server.url + "/v1/tts", json={"text": "API only.", "max_new_tokens": 8}, timeout=60)
        assert_audio(r.content, min_seconds=0.1)
        root = httpx.get(server.url + "/", follow_redirects=False)
        assert root.status_code in (302, 307) and root.headers["location"].endswith("/docs")
        assert "gradio is blocked" not in server.log_tail()


def test_an_idle_connection_outlives_the_usual_client_keep_alive(tmp_path):
    """A connection left idle longer than httpx and uvicorn keep theirs by default (5 s) still carries
    the next request: a client never reuses one the server is closing."""
    import http.client
    import time

    with DemoServer(tmp_path, "--no-ui") as server:
        host, port = server.url.removeprefix("http://").split(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=30)
        try:
            for pause in (0, 6):
                time.sleep(pause)
                connection.request("GET", "/health")
                assert connection.getresponse().read() and connection.sock is not None
        finally:
            connection.close()


def test_the_heap_is_frozen_only_once_every_batch_graph_is_captured_and_no_request_runs():
    import gc

    class Engine:
        """A stand-in whose every read by the freezer sets `polled`."""

        def __init__(self):
            self.state = {"capturing": True, "in_flight": 0}
            self.polled = threading.Event()

        @property
        def capturing(self):
            self.polled.set()
            return self.state["capturing"]

        @property
        def in_flight(self):
            self.polled.set()
            return self.state["in_flight"]

    engine = Engine()

    def seen_by_the_freezer(**state) -> None:
        """Set the engine's state and return once the freezer has polled it twice since."""
        engine.state.update(state)
        for _ in range(2):
            engine.polled.clear()
            assert engine.polled.wait(10) or not thread.is_alive(), "the freezer stopped polling"

    try:
        gc.unfreeze()
        thread = launch.freeze_heap_once_captured(engine, poll_s=0.001)
        seen_by_the_freezer(capturing=True, in_flight=0)
        assert thread.is_alive() and gc.get_freeze_count() == 0  # still capturing: nothing frozen yet
        seen_by_the_freezer(capturing=False, in_flight=3)
        assert thread.is_alive() and gc.get_freeze_count() == 0  # requests in flight: not yet either
        engine.state["in_flight"] = 0
        thread.join(timeout=10)
        assert not thread.is_alive() and gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
