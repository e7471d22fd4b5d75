"""What a trainer collects and reports: the rollout buffers, finished episodes, one update's
result, and the error a blown-up member ends with."""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np

__all__ = ["Episode", "Rollout", "StepResult", "TrainingDiverged"]


class TrainingDiverged(RuntimeError):
    """A loss, gradient or value became NaN or infinite; the run cannot continue."""


@dataclass(frozen=True)
class Episode:
    """One finished training episode: the env step at which it ended, its return (in the env's
    own rewards) and length."""

    env_step: int
    return_: float
    length: int


@dataclass
class StepResult:
    """What one update produced for one member."""

    env_steps: int
    metrics: dict[str, float]
    episodes: list[Episode]


class Rollout:
    """Preallocated time-major buffers for one rollout of every env column (reused every
    update). ``observations`` are what the policies saw (normalised where a member normalises),
    ``rewards`` what they learn from (scaled where a member scales them)."""

    def __init__(self, steps: int, columns: int, env: gym.vector.VectorEnv) -> None:
        obs_dim = env.single_observation_space.shape[0]
        action_space = env.single_action_space
        # Row T holds the observation after the last step: the bootstrap for V(s_T).
        self.observations = np.zeros((steps + 1, columns, obs_dim), np.float32)
        if isinstance(action_space, gym.spaces.Discrete):
            self.actions = np.zeros((steps, columns), np.int64)
        else:
            self.actions = np.zeros((steps, columns, action_space.shape[0]), np.float32)
        self.rewards = np.zeros((steps, columns), np.float32)
        self.terminated = np.zeros((steps, columns), bool)
        self.truncated = np.zeros((steps, columns), bool)
        # False on NEXT_STEP reset rows (the step after an episode end; see gae_core.agent.envs)
        # and on a member's rows past its budget.
        self.valid = np.ones((steps, columns), bool)

    def head(self, steps: int) -> Rollout:
        """Views of the first ``steps`` rows (and ``steps + 1`` observations): a run's last
        rollout is as long as its budget needs (``Trainer.collect``), shorter or a little
        longer than ``rollout_steps``."""
        view = object.__new__(Rollout)
        view.observations = self.observations[: steps + 1]
        for name in ("actions", "rewards", "terminated", "truncated", "valid"):
            setattr(view, name, getattr(self, name)[:steps])
        return view

    def columns(self, start: int, stop: int) -> Rollout:
        """Views of columns ``start:stop`` (one member's envs)."""
        view = object.__new__(Rollout)
        for name in ("observations", "actions", "rewards", "terminated", "truncated", "valid"):
            setattr(view, name, getattr(self, name)[:, start:stop])
        return view
