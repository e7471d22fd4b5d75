"""Several A2C+GAE runs trained together in one process, as one batched population.

A λ study trains many copies of one small network (the CartPole preset: a 4-64-64-2 actor on
8 envs × 5 steps). Trained one at a time, every pass and optimizer step handles a few dozen
rows and the time goes to per-op overhead, not arithmetic. A population
stacks its members' parameters (``[M, fan_in, fan_out]``), so each of those ops runs once for
all M members: one actor forward per vector step, one critic forward per rollout and one
backward and optimizer step per update, for the whole population. The backward pass is
derived by hand (:mod:`gae_core.agent.stacked_a2c`) unless ``autograd=True``.

What a member gets is what a single run (:class:`~gae_core.agent.trainer.Trainer`) with its
config gets:

* the same initial weights (each member's :class:`~gae_core.agent.policy.ActorCritic` is built
  from its seed and copied into the stack);
* the same losses, per member: means over the member's own valid rows, advantages standardised
  over its own rows, its own value and entropy coefficients;
* the same update: gradients of one member's loss reach only its own slice of the stack, the
  gradient norm is clipped per member, and Adam/RMSprop act element by element, so each member's
  optimizer state is its own; a member without a step (a rollout with no valid row) keeps it,
  Adam's bias correction counts its own steps and a linear learning-rate schedule its own share
  of its budget (:class:`~gae_core.agent.optim.Optimizer`; a reset row counts no step);
* the same GAE: one call with one γ and λ per column (``estimators.gae``).

Its envs are its own ``num_envs`` sub-envs of one vector env and its actions are drawn from the
population's generator, so it sees different samples from the same distributions as the single
run would: a member's results are identical in distribution to a single run's, not bit for bit.

Members may differ in :data:`PER_MEMBER` fields; every other field must be equal
(:func:`population_key`). Observation or reward normalisation keeps running statistics of the
whole vector env, which would mix members, so such configs train alone; so do gSDE configs (their
per-env exploration matrices are not stacked here).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch

from gae_core import metrics as M
from gae_core.agent.config import TrainConfig
from gae_core.agent.envs import make_vector_env
from gae_core.agent.memory import keep_freed_memory
from gae_core.agent.optim import Optimizer
from gae_core.agent.policy import ActorCritic
from gae_core.agent.stacked import StackedMLP, clip_per_member, explained_variance
from gae_core.agent.stacked_a2c import StackedA2C, log_probs_and_entropy
from gae_core.agent.together import evaluate_stacked, record_stacked
from gae_core.agent.trainer import Episode, Rollout, StepResult, TrainingDiverged
from gae_core.estimators import gae
from gae_core.trajectory import Trajectory

__all__ = ["PER_MEMBER", "Member", "PopulationTrainer", "can_join", "population_key"]

#: Fields in which the members of one population may differ.
PER_MEMBER = (
    "seed", "lambda_", "gamma", "critic_target", "critic_lambda", "value_coef", "entropy_coef",
    "max_grad_norm", "log_std_init",
)  # fmt: skip


def can_join(config: TrainConfig) -> bool:
    """Whether a run with ``config`` can train in a population (no normalisation, no gSDE,
    on the CPU)."""
    return (
        not config.normalize_observations
        and not config.normalize_rewards
        and not config.use_sde
        and config.device == "cpu"
    )


def population_key(config: TrainConfig) -> tuple:
    """What the members of one population share: every field but :data:`PER_MEMBER` and those
    that act only through the normalisers, which no population has (:func:`can_join`)."""
    skip = (*PER_MEMBER, "normalize_clip", "reward_norm_reset")
    return tuple(sorted((k, repr(v)) for k, v in config.to_dict().items() if k not in skip))


@dataclass
class _State:
    """Where one member stands."""

    env_steps: int = 0
    steps_before_update: int = 0
    active: bool = True
    error: str | None = None  # why it stopped learning (a NaN/inf blow-up)


class PopulationTrainer:
    """One update for every active member per :meth:`step` (see the module docstring)."""

    def __init__(self, configs: Sequence[TrainConfig], *, autograd: bool = False) -> None:
        """``autograd``: update with torch autograd instead of the hand-derived gradients of
        :class:`~gae_core.agent.stacked_a2c.StackedA2C` (tests and
        ``benchmarks/bench_population.py`` compare the two)."""
        if not configs:
            raise ValueError("a population needs at least one member")
        keys = {population_key(c) for c in configs}
        if len(keys) > 1 or not all(can_join(c) for c in configs):
            raise ValueError(
                "members of a population must differ only in " + ", ".join(PER_MEMBER)
                + " and train without normalisation or gSDE, on the CPU"
            )  # fmt: skip
        self.configs = list(configs)
        shared = self.shared = configs[0]
        torch.set_num_threads(shared.torch_threads)
        keep_freed_memory()  # its updates reuse large blocks (measured, agent/memory.py)
        members, per = len(configs), shared.num_envs
        self.size, self.envs_per_member = members, per
        self.env = make_vector_env(shared.env_id, members * per)
        space = self.env.single_action_space
        self.discrete = isinstance(space, gym.spaces.Discrete)
        self._bounds = None if self.discrete else (space.low, space.high)
        models = [
            ActorCritic(
                self.env.single_observation_space, space, shared.hidden_sizes, c.seed,
                c.log_std_init, ortho_init=shared.ortho_init,
            )
            for c in configs
        ]  # fmt: skip
        self._template = models[0]
        self.actor = StackedMLP([m.actor for m in models])
        self.critic = StackedMLP([m.critic for m in models])
        self.log_std = (
            None
            if self.discrete
            else torch.stack([m.log_std.detach() for m in models]).requires_grad_(True)
        )
        self.engine = None
        if autograd:
            params = self.actor.parameters() + self.critic.parameters()
            if self.log_std is not None:
                params.append(self.log_std)
        else:  # the stacks and log_std become views of the engine's flat buffer
            self.engine = StackedA2C(self.actor, self.critic, self.log_std, shared.rollout_steps)
            self.log_std = self.engine.log_std
            self.engine.flat.grad = self.engine.grad
            params = [self.engine.flat]
        self.params = params
        self.optimizer = Optimizer(params, shared.optimizer, shared.learning_rate)
        seeds = [int(c.seed) for c in configs]
        self._rng = np.random.default_rng(seeds)
        self._rollout = Rollout(shared.rollout_steps, members * per, self.env)
        self._batch = self._rollout
        self._obs, _ = self.env.reset(seed=seeds[0])
        self._reset_next = np.zeros(members * per, bool)
        self._returns = np.zeros(members * per, np.float64)
        self._lengths = np.zeros(members * per, np.int64)
        self._members = [_State() for _ in configs]
        # per column (sub-env) parameters of GAE and of the critic's target
        self._gamma = np.repeat([c.gamma for c in configs], per)
        self._lambda = np.repeat([c.lambda_ for c in configs], per)
        self._target_lambda = np.repeat([c.target_lambda for c in configs], per)
        column = lambda name: torch.tensor([float(getattr(c, name)) for c in configs])  # noqa: E731
        self._value_coef, self._entropy_coef = column("value_coef"), column("entropy_coef")
        norms = [c.max_grad_norm if c.max_grad_norm > 0 else math.inf for c in configs]
        self._max_norm = torch.tensor(norms)
        self._started = time.perf_counter()
        self.updates = 0

    # -- the population as a whole -------------------------------------------------------

    @property
    def done(self) -> bool:
        return not any(m.active for m in self._members)

    def member(self, index: int) -> Member:
        return Member(self, index)

    def deactivate(self, index: int) -> None:
        """Stop training member ``index`` (stopped, done or failed); the others go on."""
        self._members[index].active = False

    def step(self) -> dict[int, StepResult]:
        """One update of every active member: ``{member index: its StepResult}``. A member
        whose loss or gradient becomes NaN/inf is deactivated with :meth:`Member.error` set and
        left out of the result; the others are untouched by it."""
        started = time.perf_counter()
        before = [m.env_steps for m in self._members]
        for state in self._members:
            state.steps_before_update = state.env_steps
        active = [i for i, m in enumerate(self._members) if m.active]
        episodes = self._collect(active)
        metrics = self._update(active)
        self.updates += 1
        now = time.perf_counter()
        out = {}
        for i in active:
            state = self._members[i]
            if state.error is not None:
                continue
            metrics[i][M.STEPS_PER_SECOND.key] = (state.env_steps - before[i]) / (now - started)
            metrics[i][M.WALL_TIME.key] = now - self._started
            out[i] = StepResult(state.env_steps, metrics[i], episodes[i])
            if state.env_steps >= self.configs[i].total_steps:
                state.active = False  # its budget is spent
        return out

    def close(self) -> None:
        self.env.close()

    # -- collect, estimate, update ----------------------------------------------------------

    def _collect(self, active: list[int]) -> dict[int, list[Episode]]:
        shared, per, members = self.shared, self.envs_per_member, self.size
        # A member's budget ends in this rollout once it has counted ``need`` more env steps:
        # from there its rows are not its own (invalid) and its last row is a rollout end (a
        # bootstrap, as in a single run's last, shorter rollout), so no member overshoots its
        # budget by more than a single run does (under num_envs steps). The rollout is as long
        # as the member furthest from its end needs.
        need = np.zeros(members, np.int64)
        for i in active:
            need[i] = self.configs[i].total_steps - self._members[i].env_steps
        steps = min(shared.rollout_steps, max(int(-(-need.max() // per)), 1))
        rollout = self._batch = self._rollout.head(steps)
        obs, rng = self._obs, self._rng
        episodes: dict[int, list[Episode]] = {i: [] for i in active}
        live = np.zeros(members, bool)
        live[active] = True
        counted = np.zeros(members, np.int64)
        with torch.inference_mode():
            for t in range(steps):
                live_columns = np.repeat(live, per)
                rollout.observations[t] = obs
                valid = ~self._reset_next
                rollout.valid[t] = valid & live_columns
                member_obs = torch.from_numpy(obs).view(members, per, -1)
                if self.engine is None:
                    out = self.actor(member_obs)
                else:  # (keeps the activations for the update)
                    out = self.engine.act(member_obs, t)
                actions = self._sample(out.reshape(members * per, -1).numpy(), rng)
                rollout.actions[t] = actions
                env_actions = actions if self._bounds is None else np.clip(actions, *self._bounds)
                obs, rewards, terminated, truncated, _ = self.env.step(env_actions)
                rollout.rewards[t] = rewards
                rollout.terminated[t] = terminated
                rollout.truncated[t] = truncated
                self._returns += rewards
                self._lengths += valid
                self._reset_next = terminated | truncated
                if self._reset_next.any():
                    self._finish_episodes(t, episodes, live_columns)
                counted += rollout.valid[t].reshape(members, per).sum(1)
                ended = live & (counted >= need)
                if ended.any() and t < steps - 1:
                    rollout.truncated[t, np.repeat(ended, per)] = True  # its rollout ends here
                    live &= ~ended
        rollout.observations[-1] = obs
        self._obs = obs
        for i in active:
            self._members[i].env_steps += int(counted[i])
        return episodes

    def _sample(self, out: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        if self.discrete:
            return (out + rng.gumbel(size=out.shape)).argmax(axis=1)
        std = np.exp(self.log_std.detach().numpy())  # [M, A]
        std = np.repeat(std, self.envs_per_member, axis=0)
        return (out + std * rng.standard_normal(out.shape)).astype(np.float32)

    def _finish_episodes(self, t: int, episodes: dict, live_columns: np.ndarray) -> None:
        per = self.envs_per_member
        ended = np.flatnonzero(self._reset_next)
        counted = self._batch.valid[: t + 1].reshape(t + 1, self.size, per).sum((0, 2))
        owners = ended // per
        for column, member, returned, length in zip(
            ended.tolist(), owners.tolist(), self._returns[ended].tolist(),
            self._lengths[ended].tolist(), strict=True,
        ):  # fmt: skip
            if live_columns[column]:
                at_step = self._members[member].env_steps + int(counted[member])
                episodes[member].append(Episode(at_step, returned, length))
        self._returns[ended] = 0.0
        self._lengths[ended] = 0

    def _by_member(self, x: torch.Tensor) -> torch.Tensor:
        """``[T, M·E, ...]`` → ``[M, T·E, ...]`` (member-major rows)."""
        steps, members, per = x.shape[0], self.size, self.envs_per_member
        x = x.reshape(steps, members, per, *x.shape[2:]).transpose(0, 1)
        return x.reshape(members, steps * per, *x.shape[3:])

    def _estimate(self, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """GAE advantages and the critic's targets ``[M, T·E]`` from the critic's values of
        all T+1 observations (``[M, (T+1)·E]``, detached), with each column's γ and λ."""
        rollout = self._batch
        steps = rollout.rewards.shape[0]
        members, per = self.size, self.envs_per_member
        values = values.reshape(members, steps + 1, per).transpose(0, 1)
        values = values.reshape(steps + 1, members * per)
        inputs = (
            torch.from_numpy(rollout.rewards),
            values[:-1],
            values[1:],
            torch.from_numpy(rollout.terminated),
            torch.from_numpy(rollout.truncated),
        )
        advantages = gae(*inputs, gamma=self._gamma, lambda_=self._lambda)
        same = np.array_equal(self._target_lambda, self._lambda)
        critic = (
            advantages if same else gae(*inputs, gamma=self._gamma, lambda_=self._target_lambda)
        )
        return self._by_member(advantages), self._by_member(critic + values[:-1])

    def _update(self, active: list[int]) -> dict[int, dict[str, float]]:
        shared = self.shared
        metrics: dict[int, dict[str, float]] = {i: {} for i in active}
        rollout = self._batch
        rows = rollout.rewards.size // self.size  # T·E per member
        # One critic pass over all T+1 observations: its detached values feed GAE, the first
        # T·E rows (member-major, time-major within) the value loss.
        observations = self._by_member(torch.from_numpy(rollout.observations))
        if self.engine is None:
            all_values = self.critic(observations).squeeze(-1)
        else:
            all_values = self.engine.values(observations)
        detached = all_values.detach()
        finite_values = torch.isfinite(detached).all(1)
        finite_list = finite_values.tolist()
        blown = [i for i in active if not finite_list[i] and self._members[i].error is None]
        self._fail(blown, "critic values")
        # a blown-up member's columns enter GAE as zeros: its results are never used
        advantages, returns = self._estimate(torch.nan_to_num(detached, 0.0, 0.0, 0.0))
        values, observations = all_values[:, :rows], observations[:, :rows]
        mask = self._by_member(torch.from_numpy(rollout.valid)).to(advantages.dtype)  # [M, R]
        counts = mask.sum(1)
        learning = (counts > 0) & torch.tensor([m.active for m in self._members]) & finite_values
        safe = counts.clamp(min=1.0)

        def mean(x: torch.Tensor) -> torch.Tensor:  # per member, over its valid rows
            return (x * mask).sum(1) / safe

        raw_mean = mean(advantages)
        raw_std = mean((advantages - raw_mean[:, None]).square()).sqrt()
        used = advantages
        if shared.normalize_advantages:
            standardise = (counts > 1)[:, None]
            used = torch.where(
                standardise, (advantages - raw_mean[:, None]) / (raw_std[:, None] + 1e-8), used
            )
        actions = self._by_member(torch.from_numpy(rollout.actions))
        if self.engine is None:
            out = self.actor(observations)  # [M, R, A]
            log_probs, entropy = log_probs_and_entropy(out, actions, self.log_std)
            policy = -mean(used * log_probs)
            value = mean((returns - values).square())
            entropy = mean(entropy)
        else:  # the gradients are written here, for every member; clipping zeroes the idle
            terms = self.engine.gradients(
                observations, actions, used, returns, mask, self._value_coef, self._entropy_coef
            )
            policy, value, entropy = terms.policy, terms.value, terms.entropy
        per_member = policy + self._value_coef * value - self._entropy_coef * entropy
        finite = torch.isfinite(per_member.detach())
        failed = (learning & ~finite).tolist()  # per-member checks in Python: one conversion
        self._fail([i for i in active if failed[i]], "loss")
        learning &= finite
        if self.engine is None:
            self.optimizer.zero_grad()
        if bool(learning.any()):
            if self.engine is None:
                torch.where(learning, per_member, torch.zeros_like(per_member)).sum().backward()
            norms, finite = self._clip_gradients(learning)
            learning &= finite
        else:
            norms = torch.zeros(self.size)
        self.optimizer.learning_rate = self._learning_rate(active)
        if bool(learning.any()):  # a member training on without a step keeps its state
            training = torch.tensor([m.active for m in self._members])
            self.optimizer.step(rows=learning, keep=training & ~learning)
        ev = explained_variance(values.detach(), returns, mask)
        columns = (policy, value, entropy, raw_mean, raw_std, norms, ev)
        table = torch.stack([c.detach().double() for c in columns]).tolist()
        keys = (M.POLICY_LOSS, M.VALUE_LOSS, M.ENTROPY, M.ADVANTAGE_MEAN, M.ADVANTAGE_STD,
                M.GRAD_NORM, M.EXPLAINED_VARIANCE)  # fmt: skip
        learning_list = learning.tolist()
        rates = np.broadcast_to(self.optimizer.learning_rate, self.size)  # one, or per member
        for i in active:
            row = {}  # a member that took no step reports its learning rate only, as alone
            if learning_list[i]:
                row = {metric.key: table[k][i] for k, metric in enumerate(keys)}
            row[M.LEARNING_RATE.key] = float(rates[i])
            metrics[i] = row
        return metrics

    def _clip_gradients(self, learning: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Clip each member's gradient norm (:func:`clip_per_member`); a member whose norm is
        not finite is deactivated. Returns the norms before clipping and whether each is
        finite."""
        if self.engine is None:
            norms, finite = clip_per_member(self.params, self._max_norm, learning)
        else:
            norms, finite = self.engine.clip(self._max_norm, learning)
        failed = (learning & ~finite).tolist()
        self._fail([i for i in range(self.size) if failed[i]], "gradient")
        return norms, finite

    def _fail(self, members: list[int], what: str) -> None:
        for i in members:
            state = self._members[i]
            state.active = False
            state.error = (
                f"{TrainingDiverged.__name__}: {what} became non-finite at update {self.updates}"
            )

    def _learning_rate(self, active: list[int]) -> float | np.ndarray:
        """The coming update's step size: one for all, or on a linear schedule each member's
        ``[M]`` from its own share of its budget spent, as its single run's."""
        shared = self.shared
        if shared.lr_schedule == "constant" or not active:
            return shared.learning_rate
        spent = np.array([m.steps_before_update for m in self._members], np.float64)
        rates = shared.learning_rate * (1.0 - np.minimum(1.0, spent / shared.total_steps))
        same = np.all(rates[active] == rates[active[0]])
        return float(rates[active[0]]) if same else rates

    # -- evaluations, checkpoints, recordings ------------------------------------------------

    def evaluate_members(
        self, members: Sequence[int], episodes: int, seeds: Sequence[int]
    ) -> dict[int, list[float]]:
        """Deterministic evaluations (argmax / mean actions) of several members at once, one
        seed each, each as its evaluation alone would play
        (:func:`~gae_core.agent.together.evaluate_stacked`)."""
        if len(seeds) != len(members):
            raise ValueError(f"seeds: one per member, got {len(seeds)} for {len(members)}")
        if not members:
            return {}
        actor = self.actor.select(members)
        returns = evaluate_stacked(actor, self.discrete, self.shared.env_id, episodes, seeds)
        return dict(zip(members, returns, strict=True))

    def record_members(
        self, members: Sequence[int], episodes: int, seeds: Sequence[int]
    ) -> dict[int, list[Trajectory]]:
        """Recorded episodes (sampled actions) of several members at once, one seed each,
        each as :func:`~gae_core.agent.recording.record_replay` of its weights would record
        (:func:`~gae_core.agent.together.record_stacked`)."""
        if len(seeds) != len(members):
            raise ValueError(f"seeds: one per member, got {len(seeds)} for {len(members)}")
        if not members:
            return {}
        models = [self.model_of(i) for i in members]
        recorded = record_stacked(models, self.shared.env_id, episodes, seeds)
        return dict(zip(members, recorded, strict=True))

    def model_of(self, index: int) -> ActorCritic:
        """Member ``index``'s networks as a standalone :class:`ActorCritic` (a copy)."""
        config = self.configs[index]
        space = self.env.single_action_space
        model = ActorCritic(
            self.env.single_observation_space, space, config.hidden_sizes, 0, config.log_std_init,
            ortho_init=False,  # overwritten below: skip the orthogonal init's QR (1.4 ms a copy)
        )  # fmt: skip
        self.actor.copy_into(model.actor, index)
        self.critic.copy_into(model.critic, index)
        if self.log_std is not None:
            with torch.no_grad():
                model.log_std.copy_(self.log_std[index])
        return model.eval()


class Member:
    """One member of a :class:`PopulationTrainer`, seen as a single run (the part of
    :class:`~gae_core.runs.execute.TrainerLike` that is about one run)."""

    def __init__(self, population: PopulationTrainer, index: int) -> None:
        self.population, self.index = population, index
        self.config = population.configs[index]
        self._state = population._members[index]

    @property
    def env_steps(self) -> int:
        return self._state.env_steps

    @property
    def done(self) -> bool:
        return self._state.env_steps >= self.config.total_steps

    @property
    def error(self) -> str | None:
        """Why the member stopped learning, if it blew up (its run ends ``failed``)."""
        return self._state.error

    def _crossed(self, every: int) -> bool:
        state = self._state
        return every > 0 and state.env_steps // every > state.steps_before_update // every

    def checkpoint_due(self) -> bool:
        return self._crossed(self.config.checkpoint_every)

    def evaluation_due(self) -> bool:
        return self._crossed(self.config.eval_every)
