"""An example env module for ``--env-module`` / ``GAE_CORE_ENV_MODULES``: importing it registers
two gymnasium envs.

* ``GAEExample/Corridor-v0``: walk right along a corridor of 12 cells to its end (+1, the episode
  ends; −0.01 a step otherwise; 100 steps at most). Observation: the position scaled to [0, 1]
  and a constant 1; actions: 0 left, 1 right. A policy learns it in a few thousand steps.
* ``GAEExample/DictObs-v0``: the same corridor with a dict observation, which the trainer does
  not handle: naming it gives one line that says why.

Use it with ``PYTHONPATH=examples python -m gae_core --env-module gae_example_envs train --env
GAEExample/Corridor-v0``.
"""

from __future__ import annotations

from typing import ClassVar

import gymnasium as gym
import numpy as np


class Corridor(gym.Env):
    """Walk right to the end of a corridor."""

    metadata: ClassVar[dict] = {"render_modes": []}
    LENGTH = 12

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(0.0, 1.0, shape=(2,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.position = 0

    def _obs(self) -> np.ndarray:
        return np.array([self.position / (self.LENGTH - 1), 1.0], dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.position = 0
        return self._obs(), {}

    def step(self, action):
        self.position = int(np.clip(self.position + (1 if int(action) == 1 else -1), 0,
                                    self.LENGTH - 1))  # fmt: skip
        done = self.position == self.LENGTH - 1
        return self._obs(), (1.0 if done else -0.01), done, False, {}


class DictCorridor(Corridor):
    """The corridor with a dict observation (unsupported by the trainer)."""

    def __init__(self) -> None:
        super().__init__()
        self.observation_space = gym.spaces.Dict({"position": gym.spaces.Discrete(self.LENGTH)})

    def _obs(self) -> dict:
        return {"position": self.position}


gym.register("GAEExample/Corridor-v0", entry_point=Corridor, max_episode_steps=100)
gym.register("GAEExample/DictObs-v0", entry_point=DictCorridor, max_episode_steps=100)
