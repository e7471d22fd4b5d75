"""Explorer library: fresh recordings from a checkpoint and values from another critic."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from gae_core.agent.config import TrainConfig
from gae_core.agent.recording import checkpoint_bytes
from gae_core.agent.trainer import Trainer
from gae_core.insight import explorer
from gae_core.storage.store import RunStore


@pytest.fixture(scope="module")
def checkpoints():
    config = TrainConfig(total_steps=4000, num_envs=4, rollout_steps=16, checkpoint_every=0)
    trainer = Trainer(config)
    early = trainer.checkpoint_bytes()
    while not trainer.done:
        trainer.step()
    late = trainer.checkpoint_bytes()
    trainer.close()
    return config, early, late


def test_fresh_recording_is_deterministic_per_seed(checkpoints):
    config, _, late = checkpoints
    first = explorer.record_fresh(config, late, 5)
    again = explorer.record_fresh(config, late, 5)
    other = explorer.record_fresh(config, late, 6)
    np.testing.assert_array_equal(first.rewards, again.rewards)
    np.testing.assert_array_equal(first.observations, again.observations)
    assert not np.array_equal(first.observations[0], other.observations[0])
    assert first.terminated[-1] or first.truncated[-1]
    assert not (first.terminated[:-1] | first.truncated[:-1]).any()  # one episode
    with pytest.raises(ValueError, match="seed must be an integer"):
        explorer.record_fresh(config, late, -1)


def test_revalue_swaps_only_the_critic(checkpoints):
    config, early, late = checkpoints
    trajectory = explorer.record_fresh(config, late, 1)
    same = explorer.revalue(trajectory, config, late)
    np.testing.assert_allclose(same.values, trajectory.values, rtol=1e-5, atol=1e-5)
    earlier = explorer.revalue(trajectory, config, early)
    # untrained critic: different values, identical transitions and flags
    assert np.abs(earlier.values - trajectory.values).max() > 1e-3
    np.testing.assert_array_equal(earlier.rewards, trajectory.rewards)
    np.testing.assert_array_equal(earlier.terminated, trajectory.terminated)
    np.testing.assert_array_equal(earlier.next_values[:-1], earlier.values[1:])  # one batch


def test_a_run_stored_before_normalize_clip_replays_as_it_trained(tmp_path):
    """Its stored config lacks the field: the explorer reads it as unclipped (what the run did),
    not as today's default clip of 10."""
    config = TrainConfig(
        env_id="Pendulum-v1", num_envs=4, rollout_steps=8, normalize_observations=True
    )
    assert config.normalize_clip == 10.0
    trainer = Trainer(config)
    # Frozen statistics with a tiny variance: normalised inputs reach hundreds, so a clip at 10
    # binds on almost every step.
    normalization = {"obs_mean": np.zeros(3), "obs_var": np.full(3, 1e-4), "obs_count": 1.0}
    blob = checkpoint_bytes(trainer.model_of(), normalization)
    trainer.close()
    store = RunStore(tmp_path)
    before = {k: v for k, v in config.to_dict().items() if k != "normalize_clip"}
    ids = [store.create_run(before), store.create_run(config.to_dict())]
    for run_id in ids:
        store.save_checkpoint(run_id, 0, blob)
    old, new = (explorer.load_trajectory(store, i, 0, fresh_seed=3) for i in ids)
    unclipped = explorer.record_fresh(dataclasses.replace(config, normalize_clip=0.0), blob, 3)
    clipped = explorer.record_fresh(config, blob, 3)
    np.testing.assert_array_equal(old.values, unclipped.values)
    np.testing.assert_array_equal(new.values, clipped.values)
    assert np.abs(unclipped.values - clipped.values).max() > 1e-3


def test_ppo_checkpoints_and_runs_stored_before_ppo_open_in_the_explorer(tmp_path):
    """A PPO run's checkpoint replays in the explorer like an A2C run's (one checkpoint
    format); a run stored before the algorithm fields existed reads as A2C, as it trained."""
    from gae_core.agent.config import PPO_FIELDS

    ppo = TrainConfig(algo="ppo", env_id="Pendulum-v1", num_envs=2, rollout_steps=16,
                      minibatch_size=16, n_epochs=2, total_steps=96, checkpoint_every=0,
                      normalize_observations=True)  # fmt: skip
    trainer = Trainer(ppo)
    while not trainer.done:
        trainer.step()
    blob = trainer.checkpoint_bytes()
    trainer.close()
    store = RunStore(tmp_path)
    before = {k: v for k, v in TrainConfig(env_id="Pendulum-v1").to_dict().items()
              if k not in ("algo", *PPO_FIELDS)}  # fmt: skip
    ids = [store.create_run(ppo.to_dict()), store.create_run(before)]
    for run_id in ids:
        store.save_checkpoint(run_id, 96, blob)
    fresh, old = (explorer.load_trajectory(store, i, 96, fresh_seed=2) for i in ids)
    np.testing.assert_array_equal(
        fresh.observations, explorer.record_fresh(ppo, blob, 2).observations
    )
    assert len(old) > 0 and TrainConfig.from_stored(store.get_run(ids[1]).config).algo == "a2c"
    store.close()


def test_a_run_trained_on_a_gpu_opens_where_there_is_none(tmp_path, checkpoints, monkeypatch):
    """A stored config says where the run ran (``device``), not what it learnt: read back on a
    machine without CUDA it becomes a CPU config, and the run replays in the explorer as the
    same run stored from a CPU machine does. Where CUDA exists, the stored device is kept."""
    import torch

    config, _, late = checkpoints
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    store = RunStore(tmp_path)
    on_gpu = {**config.to_dict(), "device": "cuda"}
    ids = [store.create_run(on_gpu), store.create_run(config.to_dict())]
    for run_id in ids:
        store.save_checkpoint(run_id, 4000, late)
    assert TrainConfig.from_stored(store.get_run(ids[0]).config) == config
    gpu, cpu = (explorer.load_trajectory(store, i, 4000, fresh_seed=4) for i in ids)
    np.testing.assert_array_equal(gpu.observations, cpu.observations)
    np.testing.assert_array_equal(gpu.values, cpu.values)
    with pytest.raises(Exception, match="device 'cuda' is not available"):
        TrainConfig(device="cuda")  # a new run still cannot ask for it
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert TrainConfig.from_stored(on_gpu).device == "cuda"
    store.close()
