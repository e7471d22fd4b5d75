"""Replaying a policy: load a checkpoint, record an episode, re-evaluate values with any critic.

Used at every checkpoint (the recorded trajectories), by the advantage explorer (fresh
recordings, another checkpoint's critic) and by the estimator lab.
"""

from __future__ import annotations

import io

import gymnasium as gym
import numpy as np
import torch

from gae_core.agent.config import TrainConfig
from gae_core.agent.envs import episode_cap, make_eval_env
from gae_core.agent.policy import ActorCritic
from gae_core.trajectory import Trajectory

__all__ = ["evaluate_values", "load_model", "record_episode"]


def record_episode(
    env: gym.Env, model: ActorCritic, rng: np.random.Generator, seed: int, device: torch.device
) -> Trajectory:
    """One episode of ``model``'s policy (actions sampled with ``rng``) on ``env`` reset with
    ``seed``, capped at the spec's time limit (marked truncated); values in one batch."""
    obs, _ = env.reset(seed=seed)
    cap = episode_cap(env)
    bounds = None
    if isinstance(env.action_space, gym.spaces.Box):
        bounds = (env.action_space.low, env.action_space.high)
    observations, actions, rewards, terminated, truncated = [obs], [], [], [], []
    with torch.inference_mode():
        while True:
            action = model.sample(torch.as_tensor(obs[None], device=device), rng)[0]
            env_action = action if bounds is None else np.clip(action, *bounds)
            obs, reward, term, trunc, _ = env.step(env_action)
            observations.append(obs)
            actions.append(action)
            rewards.append(reward)
            terminated.append(term)
            truncated.append(bool(trunc or (len(rewards) >= cap and not term)))
            if terminated[-1] or truncated[-1]:
                break
        all_obs = torch.as_tensor(np.asarray(observations, np.float32), device=device)
        all_values = model.values(all_obs).cpu().numpy()  # one batch: next_values = values[1:]
        action_array = np.asarray(actions)
        log_probs, _ = model.log_probs_and_entropy(
            all_obs[:-1], torch.as_tensor(action_array, device=device)
        )
    all_obs = all_obs.cpu().numpy()
    return Trajectory(
        observations=all_obs[:-1],
        next_observations=all_obs[1:],
        actions=action_array,
        rewards=np.asarray(rewards, np.float32),
        values=all_values[:-1],
        next_values=all_values[1:],
        terminated=np.asarray(terminated, bool),
        truncated=np.asarray(truncated, bool),
        log_probs=log_probs.cpu().numpy().astype(np.float32),
    )


def load_model(config: TrainConfig, checkpoint_bytes: bytes) -> ActorCritic:
    """The actor-critic saved in ``checkpoint_bytes`` (``torch.load(weights_only=True)``), on
    the CPU, in eval mode."""
    env = make_eval_env(config.env_id)
    try:
        model = ActorCritic(env.observation_space, env.action_space, config.hidden_sizes, 0)
    finally:
        env.close()
    state = torch.load(io.BytesIO(checkpoint_bytes), weights_only=True, map_location="cpu")
    model.load_state_dict(state)
    return model.eval()


def evaluate_values(
    config: TrainConfig, checkpoint_bytes: bytes, observations: np.ndarray
) -> np.ndarray:
    """V(s) for ``observations [T, obs_dim]`` under the critic saved in ``checkpoint_bytes``
    (loaded with ``weights_only=True``); returns float32 ``[T]``."""
    model = load_model(config, checkpoint_bytes)
    observations = np.asarray(observations, np.float32)
    obs_dim = model.critic[0].in_features
    if observations.ndim != 2 or observations.shape[1] != obs_dim:
        raise ValueError(f"observations must have shape [T, {obs_dim}], got {observations.shape}")
    with torch.inference_mode():
        return model.values(torch.from_numpy(observations)).numpy()
