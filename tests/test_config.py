"""EngineConfig: S1_MINI_* variables, overrides, and clear errors for bad values."""

import pytest

from engine.config import EngineConfig
from engine.errors import InputError


def test_env_values_are_parsed_by_type_and_overrides_win():
    env = {"S1_MINI_DEMO": "yes", "S1_MINI_MAX_QUEUE": "7", "S1_MINI_MAX_REFERENCE_SECONDS": "30.5",
           "S1_MINI_SEED": "", "S1_MINI_DEVICE": "cpu", "S1_MINI_COMPILE": "off",
           "S1_MINI_DECODE_PRIORITY": "on", "S1_MINI_SWITCH_INTERVAL_MS": "2", "S1_MINI_READ_BACK_LAG": "2",
           "S1_MINI_ADMIT_GATHER_STEPS": "0", "S1_MINI_ADMIT_MIN_LEAD_S": "0.1"}
    config = EngineConfig.from_env(env, compile="auto", checkpoint=None)
    assert config.demo is True and config.max_queue == 7 and config.max_reference_seconds == 30.5
    assert config.seed is None and config.device == "cpu"
    assert config.decode_priority is True and config.switch_interval_ms == 2.0 and config.read_back_lag == 2
    assert config.admit_gather_steps == 0 and config.admit_min_lead_s == 0.1
    assert config.compile == "auto"  # the override wins; None overrides are ignored
    assert EngineConfig.from_env({}) == EngineConfig()


@pytest.mark.parametrize("env, message", [
    ({"S1_MINI_DEMO": "maybe"}, "true or false"),
    ({"S1_MINI_MAX_QUEUE": "lots"}, "must be a number"),
    ({"S1_MINI_PRECISION": "int3"}, "precision must be one of"),
    ({"S1_MINI_DEVICE": "tpu"}, "device must be one of"),
    ({"S1_MINI_MAX_CONTEXT": "-1"}, "max_context"),
    ({"S1_MINI_MAX_BATCH_SIZE": "-1"}, "max_batch_size"),
    ({"S1_MINI_SWITCH_INTERVAL_MS": "-0.5"}, "switch_interval_ms"),
    ({"S1_MINI_READ_BACK_LAG": "0"}, "read_back_lag must be at least 1"),
    ({"S1_MINI_ADMIT_GATHER_STEPS": "-1"}, "admit_gather_steps and admit_min_lead_s must be >= 0"),
    ({"S1_MINI_ADMIT_MIN_LEAD_S": "-0.1"}, "admit_gather_steps and admit_min_lead_s must be >= 0"),
    ({"S1_MINI_LONE_CLIP_CHUNK_FRAMES": "0"}, "lone_clip_chunk_frames must be 1 to 256"),
    ({"S1_MINI_LONE_CLIP_CHUNK_FRAMES": "512"}, "lone_clip_chunk_frames must be 1 to 256"),
])
def test_bad_values_are_explained(env, message):
    with pytest.raises(InputError, match=message):
        EngineConfig.from_env(env)


def test_demo_and_random_weights_exclude_each_other():
    with pytest.raises(InputError, match="not both"):
        EngineConfig(demo=True, random_weights=True)


def test_cuda_with_an_index_is_a_valid_device():
    assert EngineConfig(device="cuda:1").device == "cuda:1"


def test_the_admission_defaults_are_the_schedulers():
    from engine.runtime.scheduler import ADMIT_GATHER_STEPS, ADMIT_MIN_LEAD_S

    config = EngineConfig()
    assert (config.admit_gather_steps, config.admit_min_lead_s) == (ADMIT_GATHER_STEPS, ADMIT_MIN_LEAD_S)
