"""Observation and reward normalisation of each member of a trainer, with SB3's VecNormalize
semantics, its statistics its own.

A trainer steps every member's envs in one vector env, so gymnasium's vector normalisers (one
set of running statistics for the whole vector env) would mix members: one member's
observations would move another's normalisation. Here every statistic is kept per member, in
arrays ``[M, ...]`` updated in one vectorised call per env step (M instances of gymnasium's
``RunningMeanStd`` would cost M calls a step). Written because no library keeps per-group
running moments; the update is gymnasium's (and SB3's) parallel-moments rule
(Chan et al. 1979), checked against ``RunningMeanStd`` by the tests.

What is counted, as SB3's VecNormalize counts it (its envs autoreset in the same step; ours in
the next, ``gae_core.agent.envs``):

* observations: every observation a policy acts on (the first reset, every step's, a reset
  row's), never an episode's final observation (VecNormalize gets that one in ``infos`` and
  does not count it); every observation is normalised with the statistics after the update,
  ``(o − mean) / √(var + 1e-8)``, clipped to ±``normalize_clip`` when it is positive;
* rewards: each env's discounted return ``G ← γ·G + r`` of real transitions (not reset rows),
  its running variance per member, ``G`` restarted after every episode end; a reward is
  scaled to ``r / √(var + 1e-8)`` and clipped like observations. ``reward_norm_reset =
  "termination"`` keeps gymnasium's ``NormalizeReward`` rule instead: ``G ← γ·(1 − term)·G + r``,
  never restarted at a truncation (reset rows are skipped by both rules).

A member whose config does not normalise sees its raw values (its statistics are kept but
unused). :meth:`Normalizers.state` is what a member's checkpoint stores; a
:class:`~gae_core.agent.recording.Replay` applies it frozen.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gae_core.agent.config import TrainConfig

__all__ = ["NORMALIZATION_EPSILON", "Normalizers", "RunningMoments"]

#: gymnasium's and SB3's ε under the square root.
NORMALIZATION_EPSILON = 1e-8


class RunningMoments:
    """Running mean and variance of M streams at once, ``mean``/``var`` ``[M, *shape]``,
    ``count`` ``[M]``; starts as gymnasium's ``RunningMeanStd`` (mean 0, var 1, count 1e-4)."""

    def __init__(self, members: int, shape: tuple[int, ...] = ()) -> None:
        self.mean = np.zeros((members, *shape), np.float64)
        self.var = np.ones((members, *shape), np.float64)
        self.count = np.full(members, 1e-4, np.float64)

    def update(self, x: np.ndarray, counted: np.ndarray) -> None:
        """Add the samples ``x [M, B, *shape]`` where ``counted [M, B]`` is true."""
        column = (-1, *([1] * (x.ndim - 2)))
        if counted.all() and counted.shape[1]:  # every row (most steps): no weights needed
            rows = float(counted.shape[1])
            n, moved = np.full(len(counted), rows), None
            batch_mean = x.sum(1) / rows
            batch_var = np.square(x - batch_mean[:, None]).sum(1) / rows
        else:
            weights = counted.astype(np.float64)
            n = weights.sum(1)
            if not n.any():
                return
            w = weights.reshape(*weights.shape, *([1] * (x.ndim - 2)))
            safe = np.maximum(n, 1.0).reshape(column)
            batch_mean = (x * w).sum(1) / safe
            batch_var = (np.square(x - batch_mean[:, None]) * w).sum(1) / safe
            moved = (n > 0).reshape(column)
        total = self.count + n
        share = (n / total).reshape(column)
        delta = batch_mean - self.mean
        old = (self.count / total).reshape(column)
        m2 = self.var * old + batch_var * share + np.square(delta) * old * share
        mean = self.mean + delta * share
        self.mean = mean if moved is None else np.where(moved, mean, self.mean)
        self.var = m2 if moved is None else np.where(moved, m2, self.var)
        self.count = total


class Normalizers:
    """The observation and reward normalisers of every member of one trainer (module
    docstring); columns of the vector env are member-major, ``per`` envs each."""

    def __init__(self, configs: Sequence[TrainConfig], per: int, obs_dim: int) -> None:
        members = len(configs)
        self.per = per
        self.observations_on = np.array([c.normalize_observations for c in configs])
        self.rewards_on = np.array([c.normalize_rewards for c in configs])
        self.clip = np.array([c.normalize_clip for c in configs], np.float64)
        self.gamma = np.repeat([c.gamma for c in configs], per)
        self.episode_reset = np.repeat([c.reward_norm_reset == "episode_end" for c in configs], per)
        self.obs = RunningMoments(members, (obs_dim,))
        self.returns = RunningMoments(members)
        self._accumulated = np.zeros(members * per, np.float64)
        self._ended = np.zeros(members * per, bool)
        self.any_observations = bool(self.observations_on.any())
        self.any_rewards = bool(self.rewards_on.any())
        # per-step work skipped where every member agrees (one run: always)
        self._rewards_on_columns = np.repeat(self.rewards_on, per)
        self._all_episode = bool(self.episode_reset.all())
        self._no_episode = not self.episode_reset.any()

    def _members(self, x: np.ndarray) -> np.ndarray:
        return x.reshape(len(self.clip), self.per, *x.shape[1:])

    def reset(self, observations: np.ndarray) -> np.ndarray:
        """The first observations of every env (all counted), normalised."""
        self._accumulated[:] = 0.0
        self._ended[:] = False
        return self.observe(observations, np.zeros(len(observations), bool))

    def observe(
        self, observations: np.ndarray, ended: np.ndarray, live: np.ndarray | None = None
    ) -> np.ndarray:
        """One step's raw observations ``[M·E, D]``: count those not ending an episode
        (``ended``) in the columns still training (``live``, default all: a member past its
        budget or ended counts nothing more, as alone), return all of them as their members'
        policies see them."""
        if not self.any_observations:
            return observations
        counting = ~ended if live is None else ~ended & live
        counted = self._members(counting) & self.observations_on[:, None]
        x = self._members(observations.astype(np.float64))  # [M, E, D]
        self.obs.update(x, counted)
        std = np.sqrt(self.obs.var + NORMALIZATION_EPSILON)
        normalised = self._clipped((x - self.obs.mean[:, None]) / std[:, None])
        return self._where_on(self.observations_on, normalised, x, observations.shape)

    def scale_rewards(
        self,
        rewards: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        live: np.ndarray | None = None,
    ) -> np.ndarray:
        """One step's raw rewards ``[M·E]`` as their members learn from them; ``live`` as in
        :meth:`observe`."""
        if not self.any_rewards:
            return rewards
        rewards = np.asarray(rewards, np.float64)
        episode, accumulated = self.episode_reset, self._accumulated
        active = ~self._ended  # a NEXT_STEP reset row follows an end: no transition
        if not self._no_episode:
            by_episode = np.where(active, accumulated * self.gamma + rewards, 0.0)
        if not self._all_episode:
            by_termination = np.where(
                active, accumulated * self.gamma * (1.0 - terminated) + rewards, accumulated
            )
        self._accumulated = (
            by_episode if self._all_episode else by_termination if self._no_episode
            else np.where(episode, by_episode, by_termination)
        )  # fmt: skip
        counted = active & self._rewards_on_columns
        if live is not None:
            counted &= live
        self.returns.update(self._members(self._accumulated), self._members(counted))
        self._ended = terminated | truncated
        self._accumulated[self._ended & episode] = 0.0
        std = np.sqrt(self.returns.var + NORMALIZATION_EPSILON)
        x = self._members(rewards)
        scaled = self._clipped(x / std[:, None])
        return self._where_on(self.rewards_on, scaled, x, rewards.shape)

    def _clipped(self, x: np.ndarray) -> np.ndarray:
        """Each member's values ``[M, E, ...]`` clipped to ±its ``normalize_clip`` (0: not)."""
        clip = self.clip.reshape(-1, *([1] * (x.ndim - 1)))
        if (self.clip == self.clip[0]).all():  # one clip for all (one run: always)
            return np.clip(x, -self.clip[0], self.clip[0]) if self.clip[0] > 0 else x
        return np.where(clip > 0, np.clip(x, -clip, clip), x)

    def _where_on(self, on: np.ndarray, normalised, raw, shape) -> np.ndarray:
        """Each member's normalised values where it normalises, else its raw ones, as float32
        in the vector env's ``shape``."""
        if not on.all():
            normalised = np.where(on.reshape(-1, *([1] * (raw.ndim - 1))), normalised, raw)
        return normalised.reshape(shape).astype(np.float32)

    def state(self, member: int) -> dict[str, np.ndarray]:
        """Member ``member``'s statistics as its checkpoint stores them (only those its config
        uses; empty without normalisation)."""
        state: dict[str, np.ndarray] = {}
        if self.observations_on[member]:
            state["obs_mean"] = self.obs.mean[member].copy()
            state["obs_var"] = self.obs.var[member].copy()
            state["obs_count"] = np.asarray(self.obs.count[member])
        if self.rewards_on[member]:
            state["return_var"] = np.asarray(self.returns.var[member])
        return {k: np.array(v, np.float64) for k, v in state.items()}
