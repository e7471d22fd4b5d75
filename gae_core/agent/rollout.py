"""What a trainer collects and reports: the rollout buffers, finished episodes, one update's
result, and the error a blown-up member ends with."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np

__all__ = ["Episode", "EpisodeTally", "Rollout", "StepResult", "TrainingDiverged"]


class TrainingDiverged(RuntimeError):
    """A loss, gradient or value became NaN or infinite; the run cannot continue."""


@dataclass(frozen=True)
class Episode:
    """One finished training episode: the env step at which it ended, its return (in the env's
    own rewards), its length and when it ended (``time.monotonic()``: not compared, two
    runs of one seed end the same episodes at other times)."""

    env_step: int
    return_: float
    length: int
    ended_at: float = field(compare=False)


class EpisodeTally:
    """Each env column's running return (in the env's own rewards) and length in its current
    episode; :meth:`finish` turns the episodes that end into :class:`Episode` s."""

    def __init__(self, columns: int, per: int) -> None:
        self.per = per  # env columns per member, member-major
        self.returns = np.zeros(columns, np.float64)
        self.lengths = np.zeros(columns, np.int64)

    def add(self, rewards: np.ndarray, valid: np.ndarray) -> None:
        """One step's rewards of every column; ``valid``: the columns where it is a step of
        an episode (not a NEXT_STEP reset row)."""
        self.returns += rewards
        self.lengths += valid

    def finish(
        self,
        ended: np.ndarray,
        live: np.ndarray,
        at_step: np.ndarray,
        episodes: dict[int, list[Episode]],
    ) -> None:
        """Close the episodes of the columns ``ended`` (bool); those of ``live`` columns are
        appended to their member's list in ``episodes``, ended at the member's env step
        ``at_step[member]``."""
        columns = np.flatnonzero(ended)
        now = time.monotonic()
        for column, returned, length in zip(
            columns.tolist(), self.returns[columns].tolist(), self.lengths[columns].tolist(),
            strict=True,
        ):  # fmt: skip
            if live[column]:
                member = column // self.per
                episodes[member].append(Episode(int(at_step[member]), returned, length, now))
        self.returns[columns] = 0.0
        self.lengths[columns] = 0


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

    def valid_rows(self, steps: int, members: int) -> np.ndarray:
        """Each member's valid rows ``[M]`` in the first ``steps`` rows (its env steps so far;
        columns member-major)."""
        return self.valid[:steps].reshape(steps, members, -1).sum((0, 2))

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
