"""The Ray Serve application's settings, without starting Ray: the checked-in Serve configs, the
replica counts and autoscaling options launch.py and deploy/ give Serve, and the voice routing's keys."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("ray.serve")
yaml = pytest.importorskip("yaml")

from ray.serve.schema import ServeDeploySchema  # noqa: E402

from app.cluster.application import ClusterSettings, build  # noqa: E402
from app.cluster.launcher import REPO_ROOT, cluster_settings, job_runtime_env, parse_replicas  # noqa: E402
from app.cluster.routing import preferred_replica, voice_key  # noqa: E402
from engine.config import EngineConfig  # noqa: E402
from engine.errors import InputError  # noqa: E402

pytestmark = pytest.mark.cluster
DEPLOY = Path(__file__).resolve().parents[1] / "deploy"


def serve_configs():
    yield "serve.yaml", yaml.safe_load((DEPLOY / "serve.yaml").read_text())
    service = yaml.safe_load((DEPLOY / "kuberay-rayservice.yaml").read_text())
    yield "kuberay-rayservice.yaml", yaml.safe_load(service["spec"]["serveConfigV2"])


@pytest.mark.parametrize("name,config", list(serve_configs()), ids=lambda v: v if isinstance(v, str) else "")
def test_checked_in_serve_configs_are_valid_and_build(name, config):
    ServeDeploySchema.model_validate(config)
    (app,) = config["applications"]
    assert app["import_path"] == "app.cluster.application:build"
    ingress = build(app["args"])._bound_deployment  # noqa: SLF001 (what Serve will deploy)
    engine = ingress.init_args[0]._bound_deployment  # noqa: SLF001
    assert engine.name == "EngineReplica" and ingress.name == "Ingress"
    assert engine.max_ongoing_requests == app["args"].get("max_ongoing_requests", 128)
    assert engine.ray_actor_options["num_gpus"] == app["args"]["gpus_per_replica"]


def test_the_kuberay_gpu_workers_scale_with_the_engine_replicas():
    service = yaml.safe_load((DEPLOY / "kuberay-rayservice.yaml").read_text())["spec"]
    (app,) = yaml.safe_load(service["serveConfigV2"])["applications"]
    cluster = service["rayClusterConfig"]
    (gpus,) = [group for group in cluster["workerGroupSpecs"] if group["groupName"] == "gpu"]
    assert cluster["enableInTreeAutoscaling"] is True  # without the autoscaler the group stays at `replicas`
    per_worker = int(gpus["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
    replicas_per_worker = per_worker // app["args"]["gpus_per_replica"]
    assert gpus["minReplicas"] * replicas_per_worker <= app["args"]["min_replicas"]
    assert gpus["maxReplicas"] * replicas_per_worker >= app["args"]["max_replicas"]


def test_autoscaling_settings_reach_the_engine_deployment():
    settings = ClusterSettings.from_args({"min_replicas": "1", "max_replicas": "4", "target_ongoing_requests": "16"})
    options = settings.engine_options()
    assert options["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 4, "initial_replicas": 1,
                                             "target_ongoing_requests": 16.0}
    assert "num_replicas" not in options
    fixed = ClusterSettings(replicas=3).engine_options()
    assert fixed["num_replicas"] == 3 and "autoscaling_config" not in fixed
    assert fixed["ray_actor_options"]["num_gpus"] == 1


def test_serve_queues_a_cluster_worth_of_requests_and_refuses_the_rest_with_429():
    fixed = ClusterSettings(replicas=2, max_ongoing_requests=4).engine_options()
    assert fixed["max_queued_requests"] == 2 * 4  # a burst the replicas can take is never refused
    scaling = ClusterSettings(min_replicas=1, max_replicas=3, max_ongoing_requests=4).engine_options()
    assert scaling["max_queued_requests"] == 3 * 4
    assert ClusterSettings(max_queued_requests=5).engine_options()["max_queued_requests"] == 5
    refusal = fixed["backpressure_config"]
    assert refusal.status_code == 429 and refusal.retry_after_s >= 1


def test_replicas_take_what_their_engine_takes():
    cpu = EngineConfig(device="cpu", max_batch_size=3, max_queue=5)
    assert cluster_settings("2", cpu, gpus_in_cluster=0).max_ongoing_requests == 3 + 5
    assert cluster_settings("auto", EngineConfig(max_queue=16), gpus_in_cluster=2).max_ongoing_requests == 64 + 16
    built = build({"replicas": 2, "gpus_per_replica": 0, "max_batch_size": 3, "max_queue": 5})
    engine = built._bound_deployment.init_args[0]._bound_deployment  # noqa: SLF001 (what Serve will deploy)
    assert engine.max_ongoing_requests == 3 + 5 and engine.max_queued_requests == 2 * (3 + 5)
    # The engine's queue also holds what Serve sends while cancelled requests are leaving the engine.
    assert engine.init_args[0].max_queue == 5 + (3 + 5)


def test_a_serve_config_takes_cors_origins_and_openai_voices_from_its_environment(monkeypatch):
    monkeypatch.setenv("S1_MINI_CORS_ORIGINS", "https://app.example.com/, https://b.example")
    monkeypatch.setenv("S1_MINI_OPENAI_VOICES", "alloy=narrator")
    ingress = build({"replicas": 1, "gpus_per_replica": 0})._bound_deployment  # noqa: SLF001
    assert ingress.init_kwargs["cors_origins"] == ("https://app.example.com", "https://b.example")
    assert ingress.init_kwargs["openai_voices"] == {"alloy": "narrator"}
    monkeypatch.setenv("S1_MINI_OPENAI_VOICES", "alloy")
    with pytest.raises(InputError, match="S1_MINI_OPENAI_VOICES"):
        build({"replicas": 1, "gpus_per_replica": 0})


def test_drain_seconds_reach_the_engine_replicas_and_the_ingress():
    # launch.py passes its --drain-seconds; a Serve config its args' drain_s.
    settings = cluster_settings("2", EngineConfig(device="cpu"), gpus_in_cluster=0, drain_s=7)
    assert settings.engine_options()["graceful_shutdown_timeout_s"] == 7
    assert settings.ingress_options()["graceful_shutdown_timeout_s"] == 7
    assert ClusterSettings.from_args({"drain_s": "2.5"}).engine_options()["graceful_shutdown_timeout_s"] == 2.5


@pytest.mark.parametrize("bad", [{"min_replicas": 2}, {"min_replicas": 3, "max_replicas": 2}, {"replicas": 0},
                                 {"max_ongoing_requests": 0}, {"max_queued_requests": 0}, {"drain_s": -1}])
def test_bad_cluster_settings_say_what_is_wrong(bad):
    with pytest.raises(InputError):
        ClusterSettings(**bad)


def test_a_checkout_travels_to_an_existing_cluster_and_an_installed_copy_does_not(tmp_path):
    checkout = job_runtime_env({"S1_MINI_API_KEY": "k"})  # these tests run from the checkout
    assert checkout["working_dir"] == str(REPO_ROOT) and ".git" in checkout["excludes"]
    # pip install . or the image: the code's folder is site-packages, GBs that Ray refuses to upload
    assert job_runtime_env({}, root=tmp_path) == {"env_vars": {}}


def test_replicas_flag():
    assert parse_replicas("2") == (2, 2)
    assert parse_replicas("1-4") == (1, 4)
    assert parse_replicas("auto") == (None, None)
    for bad in ("0", "4-1", "two", "-3"):
        with pytest.raises(ValueError, match="--replicas"):
            parse_replicas(bad)
    gpu = EngineConfig()
    assert cluster_settings("auto", gpu, gpus_in_cluster=4).replicas == 4
    with pytest.raises(ValueError, match="has none"):
        cluster_settings("auto", gpu, gpus_in_cluster=0)
    cpu = cluster_settings("2", EngineConfig(device="cpu"), gpus_in_cluster=0)
    assert cpu.replicas == 2 and cpu.gpus_per_replica == 0
    assert cluster_settings("1-3", gpu, gpus_in_cluster=1).autoscaling


def test_voice_keys_and_preferred_replicas():
    assert voice_key("alice", [b"ignored"]) == voice_key("Alice", []) == "voice:alice"  # ids ignore case
    assert voice_key(None, []) is None
    assert voice_key(None, [b"clip"]) == voice_key(None, [b"clip"]) != voice_key(None, [b"other clip"])
    replicas = [SimpleNamespace(replica_id=SimpleNamespace(unique_id=f"r{i}")) for i in range(4)]
    keys = [f"voice:{i}" for i in range(200)]
    chosen = {key: preferred_replica(key, replicas).replica_id.unique_id for key in keys}
    assert len(set(chosen.values())) == 4  # voices spread over every replica
    # Removing a replica moves only the voices it preferred.
    survivors = [r for r in replicas if r.replica_id.unique_id != "r0"]
    for key in keys:
        if chosen[key] != "r0":
            assert preferred_replica(key, survivors).replica_id.unique_id == chosen[key]
