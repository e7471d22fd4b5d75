"""TrainConfig: validation names the field and its range, dict round trip, form metadata."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from gae_core.agent.config import (
    FIELD_SPECS,
    ConfigError,
    TrainConfig,
    field_problems,
    parse_int,
    scheduled,
)
from gae_core.agent.envs import SUPPORTED_ENVS
from gae_core.agent.field_spec import echo, int_problem
from gae_core.agent.presets import PRESETS, preset_config

# Per field, values that must be rejected (each raises ConfigError naming the field).
BAD_VALUES = {
    "env_id": ["", "NoSuchEnv-v0", "gymnasium.envs.classic_control:CartPoleEnv", "a:b", 3],
    "num_envs": [0, -1, 1025, 2.5, True, "8"],
    "rollout_steps": [0, 4097, 1.0, None],
    "total_steps": [0, -5, 10**11, "many"],
    "gamma": [-0.1, 1.5, float("nan"), "0.9", True],
    "lambda_": [-0.01, 1.01, float("inf"), None],
    "learning_rate": [0.0, -1e-3, 2.0, float("nan")],
    "optimizer": ["sgd", "Adam", None],
    "value_coef": [-1.0, 101.0],
    "entropy_coef": [-0.1, 11.0],
    "max_grad_norm": [-0.5, float("inf")],
    "hidden_sizes": [(), (0,), (64, -1), (64.0,), "64", 64, (True,), (1,) * 9, (5000,)],
    "normalize_advantages": [1, "yes", None],
    "seed": [-1, 2**31, 1.5],
    "device": ["tpu", "", None],
    "checkpoint_every": [-1, 0.5],
    "record_episodes": [-1, 101],
    "torch_threads": [0, 257, 1.0],
    "lr_schedule": ["cosine", "", None],
    "normalize_observations": [1, "true"],
    "normalize_rewards": [0, None],
    "normalize_clip": [-1.0, float("nan"), 2e6, "10"],
    "reward_norm_reset": ["truncation", "", None],
    "critic_target": ["td", "returns", None],
    "critic_lambda": [-0.1, 1.5, float("nan")],
    "log_std_init": [-5.5, 2.5, "0"],
    "use_sde": [1, "yes"],
    "ortho_init": [0, "no"],
    "eval_every": [-1, 0.5],
    "eval_episodes": [0, 101, 2.0],
    "log_every": [-1, 0.5, 10**11],
    "algo": ["trpo", None, "PPO"],
    "n_epochs": [0, 1001, 2.5],
    "minibatch_size": [0, 10**7 + 1, "64"],
    "clip_range": [0.0, -0.1, 11.0],
    "clip_range_schedule": ["cosine", None],
    "clip_range_vf": [-1.0, float("inf")],
    "target_kl": [-0.01, float("nan")],
    "sde_sample_freq": [-2, 10**6 + 1, 1.5],
}


def test_every_field_has_bad_values_listed():
    assert set(BAD_VALUES) == {f.name for f in dataclasses.fields(TrainConfig)}


@pytest.mark.parametrize(
    ("name", "value"), [(name, v) for name, values in BAD_VALUES.items() for v in values]
)
def test_bad_value_raises_config_error_naming_the_field(name, value):
    with pytest.raises(ConfigError, match=rf"^{name}\b"):
        TrainConfig(**{name: value})


def test_field_problems_lists_every_bad_field_with_the_message_building_would_raise():
    """One bad value per field, all in one dict: each field's problem is the message that
    field alone raises from TrainConfig; valid fields and a valid config give none."""
    bad = {name: values[0] for name, values in BAD_VALUES.items()} | {"bogus": 1}
    problems = field_problems(bad)
    assert set(problems) == set(bad)
    for name, value in bad.items():
        with pytest.raises((ConfigError, TypeError)) as raised:
            TrainConfig(**{name: value})
        if name != "bogus":
            assert problems[name] == str(raised.value)
    assert problems["bogus"].startswith("unknown config field 'bogus'; fields: algo, env_id,")
    assert field_problems(TrainConfig(gamma=0.9).to_dict()) == {}
    assert field_problems({"gamma": 0.9, "num_envs": 0}) == {
        "num_envs": "num_envs must be an integer in [1, 1024], got 0"
    }


def test_a_ppo_minibatch_larger_than_a_rollout_is_refused_naming_the_field():
    """The one check across fields: TrainConfig and the form's field_problems say the same,
    under minibatch_size, with the rollout's size; A2C ignores the field."""
    message = "minibatch_size must be at most num_envs × rollout_steps = 32 for PPO, got 64"
    values = dict(algo="ppo", num_envs=4, rollout_steps=8, minibatch_size=64)
    with pytest.raises(ConfigError, match=message.replace("×", ".")):
        TrainConfig(**values)
    assert field_problems(values) == {"minibatch_size": message}
    assert TrainConfig(**{**values, "algo": "a2c"}).minibatch_size == 64
    assert field_problems({**values, "minibatch_size": 32}) == {}
    # a bad value of one of the fields involved is reported as that field's own problem
    assert set(field_problems({**values, "num_envs": 0})) == {"num_envs"}


def test_range_in_message():
    with pytest.raises(ConfigError, match=r"gamma must be in \[0.0, 1.0\], got 1.5"):
        TrainConfig(gamma=1.5)
    with pytest.raises(ConfigError, match=r"optimizer must be one of adam, rmsprop, got 'sgd'"):
        TrainConfig(optimizer="sgd")


def test_unknown_or_module_env_id_lists_supported_ids():
    for env_id in ["NoSuchEnv-v0", "gymnasium.envs.classic_control:CartPoleEnv"]:
        with pytest.raises(ConfigError) as info:
            TrainConfig(env_id=env_id)
        assert all(supported in str(info.value) for supported in SUPPORTED_ENVS)


_CHECKED_AT_ONCE = """
import json, sys, threading
from gae_core.agent.envs import env_id_problem
ids = sys.argv[1:]
problems, barrier = {}, threading.Barrier(len(ids))
def check(env_id):
    barrier.wait()
    problems[env_id] = env_id_problem(env_id)
threads = [threading.Thread(target=check, args=(i,)) for i in ids]
[t.start() for t in threads]
[t.join() for t in threads]
print(json.dumps(problems))
"""


def test_env_ids_checked_by_several_threads_at_once_all_build():
    """Four classic-control ids checked at the same moment by four threads of a fresh process
    (a dashboard's sessions, a benchmark's jobs): each builds. Unserialised, one thread saw
    another's half-imported package ("cannot import name 'CartPoleEnv' from partially
    initialized module") in 6 of 8 fresh processes, and the per-id cache kept that as the id's
    problem for the life of the process."""
    ids = ["CartPole-v1", "MountainCarContinuous-v0", "Acrobot-v1", "MountainCar-v0"]
    for _ in range(6):
        done = subprocess.run([sys.executable, "-c", _CHECKED_AT_ONCE, *ids], capture_output=True,
                              text=True, timeout=120, check=True)  # fmt: skip
        assert json.loads(done.stdout) == dict.fromkeys(ids), done.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="cuda is available here")
def test_cuda_rejected_when_unavailable():
    with pytest.raises(ConfigError, match="device 'cuda' is not available"):
        TrainConfig(device="cuda")


def test_supported_envs_and_thresholds():
    for env_id in [
        "CartPole-v1",
        "Acrobot-v1",
        "MountainCar-v0",
        "Pendulum-v1",
        "MountainCarContinuous-v0",
    ]:
        assert env_id in SUPPORTED_ENVS
    assert SUPPORTED_ENVS["CartPole-v1"] == 475.0
    assert SUPPORTED_ENVS["Pendulum-v1"] is None  # its spec has no threshold
    assert {"HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "InvertedPendulum-v5"} <= set(
        SUPPORTED_ENVS
    )
    for env_id in SUPPORTED_ENVS:
        TrainConfig(env_id=env_id)


def test_every_supported_env_has_a_preset_that_builds_and_validates():
    """Presets are one table: every supported env has a row, each row names only real fields
    and passes TrainConfig validation, and the resolved config round-trips through a dict."""
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    assert set(PRESETS) == set(SUPPORTED_ENVS)
    for env_id, preset in PRESETS.items():
        assert set(preset.values) <= fields, env_id
        assert preset.why and preset.zoo, env_id
        config = preset_config(env_id)
        assert config.env_id == env_id and config.total_steps == preset.values["total_steps"]
        for name, value in preset.values.items():
            assert getattr(config, name) == (tuple(value) if isinstance(value, list) else value)
        assert TrainConfig.from_dict(config.to_dict()) == config
        assert preset_config(env_id, seed=7, lambda_=0.5).lambda_ == 0.5  # the user overrides


def test_target_lambda_follows_the_critic_target_field():
    assert TrainConfig(lambda_=0.8).target_lambda == 0.8
    fixed = TrainConfig(lambda_=0.8, critic_target="fixed_lambda", critic_lambda=1.0)
    assert fixed.target_lambda == 1.0
    assert TrainConfig.from_dict({"lambda_": 0.3}).critic_target == "advantage_lambda"


def test_dict_round_trip_is_json_safe():
    config = TrainConfig(hidden_sizes=(32, 16), gamma=0.9, optimizer="rmsprop", seed=7)
    data = json.loads(json.dumps(config.to_dict()))
    assert TrainConfig.from_dict(data) == config
    assert data["hidden_sizes"] == [32, 16]


def test_from_dict_rejects_unknown_keys_and_fills_defaults():
    with pytest.raises(ConfigError, match="unknown config keys \\['colour'\\]"):
        TrainConfig.from_dict({"colour": "red"})
    assert TrainConfig.from_dict({"seed": 3}) == TrainConfig(seed=3)


def test_stored_configs_without_a_later_field_keep_the_behaviour_they_ran_with():
    # normalize_clip and reward_norm_reset arrived after runs were stored: those never clipped
    # and restarted their return at termination only; new ones clip at 10 and restart at
    # every episode end.
    assert TrainConfig().normalize_clip == 10.0
    assert TrainConfig.from_dict({"seed": 3}).normalize_clip == 10.0
    assert TrainConfig().reward_norm_reset == "episode_end"
    assert TrainConfig.from_stored({"seed": 3}) == TrainConfig(
        seed=3, normalize_clip=0.0, reward_norm_reset="termination"
    )
    stored = TrainConfig(normalize_clip=5.0).to_dict()
    assert TrainConfig.from_stored(stored) == TrainConfig.from_dict(stored)
    with pytest.raises(ConfigError, match="unknown config keys"):
        TrainConfig.from_stored({"colour": "red"})
    with pytest.raises(ConfigError, match="config must be a dict"):
        TrainConfig.from_stored([])


def test_values_are_normalised_and_frozen():
    config = TrainConfig(gamma=1, hidden_sizes=[8, 8])
    assert isinstance(config.gamma, float) and config.hidden_sizes == (8, 8)
    assert config.batch_size == config.num_envs * config.rollout_steps
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.gamma = 0.5


def test_metadata_drives_form_and_docstring():
    for f in dataclasses.fields(TrainConfig):
        assert set(f.metadata) == {"help", "min", "max", "choices"}
        assert f.metadata["help"]
        assert f"{f.name}: {f.metadata['help']}" in TrainConfig.__doc__
        default = f.default
        if f.metadata["choices"] is not None:
            assert default in f.metadata["choices"]
        elif f.metadata["min"] is not None and not isinstance(default, tuple | bool):
            assert f.metadata["min"] <= default <= f.metadata["max"]


@pytest.mark.parametrize(
    "text, value",
    [("42", 42), (" 42 ", 42), ("-3", -3), ("1_000", 1000), ("1,000", 1000), ("-1,000", -1000),
     ("12,345,678", 12_345_678), ("1e6", 1_000_000), ("2.5E+3", 2500),
     ("99999999999999999999", 10**20 - 1),
     # exactly (a float would read 1e30 as …8656)
     ("1e30", 10**30), ("1e400", 10**400), ("1e4299", 10**4299)],
)  # fmt: skip
def test_an_integer_typed_as_text_is_read_with_its_separators(text, value):
    assert parse_int(text) == value


@pytest.mark.parametrize(
    "text",
    ["", "abc", "1.5", "1,0", "1,00", "1,0000", ",100", "1,,000", "1,000.5", "inf", "nan",
     "1e-400", "5e-1", "1e5000", "1e4300", "1e9999999999999999999"],  # a tiny exponent
    # rounds to 0 (checkpoint_every 0: never);
    # past 4,300 digits Python cannot write the int a message would quote
)  # fmt: skip
def test_text_that_is_not_one_integer_is_refused(text):
    with pytest.raises(ValueError):
        parse_int(text)


def test_an_int_fields_parse_error_names_it_and_its_whole_range():
    with pytest.raises(ConfigError) as error:
        FIELD_SPECS["seed"].parse("x")
    assert str(error.value) == "seed must be an integer in [0, 2147483647], got 'x'"
    assert FIELD_SPECS["seed"].parse(" 1,000 ") == 1000


@pytest.mark.parametrize("text", ["64x64", "64, 64", "64 64", " 64 X 64 ", "64,64"])
def test_hidden_sizes_read_each_way_the_form_and_cli_write_them(text):
    assert FIELD_SPECS["hidden_sizes"].parse(text) == (64, 64)


@pytest.mark.parametrize("text", ["64,,64", "64,", ",64", "64xx64", "64 x, 64", "", " "])
def test_hidden_sizes_with_an_empty_place_are_refused_not_read_as_fewer_layers(text):
    with pytest.raises(ConfigError, match=r"^hidden_sizes: cannot read .*expected 1 to 8"):
        FIELD_SPECS["hidden_sizes"].parse(text)


def test_one_owner_words_every_whole_number_out_of_its_range():
    """The form's seed (field_problems, a text box's parse) and the lab's (check_int) are refused
    in int_problem's words; what each accepts is unchanged."""
    import numpy as np

    from gae_core.lab.settings import check_int

    top = FIELD_SPECS["seed"].max
    for value in (-1, top + 1, 10**20, 1.5, True, None, "seven"):
        expected = int_problem("seed", value, 0, top)
        assert expected.startswith(f"seed must be an integer in [0, {top}], got ")
        assert field_problems({"seed": value}) == {"seed": expected}
        with pytest.raises(ValueError) as lab:
            check_int("seed", value, 0, top)
        assert str(lab.value) == expected
    with pytest.raises(ConfigError) as read:
        FIELD_SPECS["seed"].parse("seven")
    assert str(read.value) == int_problem("seed", "seven", 0, top)
    for value in (0, top, np.int64(7)):
        assert int_problem("seed", value, 0, top) is None and not field_problems({"seed": value})
        assert check_int("seed", value, 0, top) == value


def test_a_message_quotes_a_long_typed_value_by_its_start_and_length():
    assert [echo("seven"), echo(7), echo(-7), echo(1.5), echo("a\x07")] == [
        "'seven'", "7", "-7", "1.5", "'a\\x07'"
    ]  # fmt: skip
    assert echo("9" * 30) == repr("9" * 30) and echo(10**29) == str(10**29)  # whole up to 30
    assert echo("9" * 5000) == "'99999999999999999999…' (5,000 digits)"
    assert echo(" -" + "9" * 31) == "' -999999999999999999…' (31 digits)"
    assert echo(-(10**4000)) == "-1000000000000000000… (4,001 digits)"
    assert echo("[x](y) " * 100) == "'[x](y) [x](y) [x](y)…' (700 characters)"
    assert echo(10**5000) == "an integer of about 5,000 digits"  # past Python's int-to-text limit
    # a cleared box, number or text, is "nothing" (the Train form and the lab say it alike)
    assert echo(None) == echo("") == echo("  ") == "nothing"
    assert (
        int_problem("states N", "", 1, 4096)
        == "states N must be an integer in [1, 4096], got nothing"
    )
    # every message that quotes what was typed quotes a 5,000-digit value so
    typed = "9" * 5000
    quoted = "'99999999999999999999…' (5,000 digits)"
    for spec, text in (("seed", typed), ("hidden_sizes", f"64, {typed}x"), ("gamma", typed + "x")):
        with pytest.raises(ConfigError) as error:
            FIELD_SPECS[spec].parse(text)
        assert len(str(error.value)) < 160 and "…'" in str(error.value), spec
    with pytest.raises(ConfigError, match=re.escape(f"got {quoted}") + "$"):
        FIELD_SPECS["seed"].parse(typed)
    assert field_problems({"seed": 10**4000 - 1})["seed"].endswith(
        "got 99999999999999999999… (4,000 digits)"
    )


@given(
    value=st.floats(1e-6, 10.0),
    total=st.integers(1, 10**7),
    share=st.floats(0.0, 2.0),
)
def test_a_schedule_is_its_value_constant_or_decayed_linearly_to_zero_at_the_budget(
    value, total, share
):
    """``scheduled``: value · (1 − min(1, spent / total_steps)) under "linear" (SB3's lin_),
    the value itself under "constant"; 0 from the budget on, never negative."""
    spent = int(share * total)
    assert scheduled(value, "constant", spent, total) == value
    linear = scheduled(value, "linear", spent, total)
    assert linear == pytest.approx(value * max(0.0, 1.0 - spent / total), rel=1e-12, abs=0)
    assert scheduled(value, "linear", 0, total) == value
    assert scheduled(value, "linear", total, total) == 0.0
    assert 0.0 <= linear <= value
