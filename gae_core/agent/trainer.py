"""The trainer: M ≥ 1 runs of A2C or PPO with GAE(γ, λ) advantages, trained together in one
process (Mnih et al. 2016; Schulman et al. 2016, arXiv:1506.02438; Schulman et al. 2017).

A single run is a trainer of one member; a λ study's trials that share an env and a network
shape are one trainer of many. The members' parameters are stacked (``[M, fan_in, fan_out]``,
:class:`~gae_core.agent.stacked.StackedMLP`), so every pass runs once for all of them: one
actor pass per vector step, one critic pass per rollout, one backward and optimizer step per
gradient step. Each :meth:`Trainer.step` is, for every member still training:

    collect   its ``num_envs`` sub-envs of one vector env × ``rollout_steps`` steps
    estimate  V on all T+1 observations in one pass, then ``estimators.gae`` with each
              column's γ and λ → advantages, and the critic's target (λ-returns with
              ``config.target_lambda``)
    update    :mod:`gae_core.agent.update`: A2C's one gradient step or PPO's epochs of
              minibatches, on the losses of :mod:`gae_core.agent.losses`, by autograd or,
              without gSDE, by hand (:attr:`by_hand`; A2C's from the rollout's activations)

What a member gets is what it would get trained alone: its own initial weights (built from its
seed), its own normalisation statistics (:mod:`gae_core.agent.normalize`), gSDE matrices,
losses over its own valid rows, gradient-norm clip, learning rate and schedule, and optimizer
state (Adam/RMSprop act element by element; a member that takes no step keeps its state). Its
envs are its own sub-envs and its actions come from the trainer's generator, so it sees
different samples from the same distributions: a member's results equal a lone run's in
distribution, and on the same data exactly (``tests/test_trainer.py``). Members share only
:data:`SHARED` fields (:func:`population_key`).

The critic's target is a choice the run records (``critic_target``): λ-returns with the
advantage's λ, as SB3 and CleanRL do, or with a λ of its own; ``critic_lambda`` 1.0 is the
paper's choice (eq. 28). Deviations from the paper, standard in A2C and PPO implementations:
the paper fits the policy with TRPO and the critic by a trust-region regression; here both
take Adam/RMSprop steps on one shared loss, advantages are optionally standardised, and each
member's gradient norm is clipped.

Determinism: for given configs (``torch_threads`` included) the same metrics. Weights come from
local ``torch.Generator``s and actions from a local ``np.random.Generator``; only
``torch.set_num_threads`` is process-wide (the last trainer built sets it).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch

from gae_core import metrics as M
from gae_core.agent.config import TrainConfig, scheduled
from gae_core.agent.envs import make_vector_env
from gae_core.agent.memory import keep_freed_memory
from gae_core.agent.normalize import Normalizers
from gae_core.agent.optim import Optimizer
from gae_core.agent.played_together import evaluate_replays, record_replays_together
from gae_core.agent.policy import ActorCritic, sample_actions
from gae_core.agent.recording import Replay, checkpoint_bytes
from gae_core.agent.rollout import Episode, EpisodeTally, Rollout, StepResult, TrainingDiverged
from gae_core.agent.stacked import StackedMLP, host, one_buffer
from gae_core.agent.update import Batch, Learner, gradient_by_hand
from gae_core.estimators import gae
from gae_core.trajectory import Trajectory

__all__ = [
    "SHARED", "Episode", "Member", "Rollout", "StepResult", "Trainer", "TrainingDiverged",
    "population_key",
]  # fmt: skip

#: Fields every member of one trainer shares: the env and its vector shape, the networks' shape,
#: the optimizer's kind, the algorithm and its update's shape, the device, and what the run loop
#: plays jointly (evaluation and recorded episodes). Every other field is per member.
SHARED = (
    "algo", "env_id", "num_envs", "rollout_steps", "hidden_sizes", "optimizer", "use_sde",
    "n_epochs", "minibatch_size", "device", "torch_threads", "eval_episodes", "record_episodes",
)  # fmt: skip


def population_key(config: TrainConfig) -> tuple:
    """What the members of one trainer share (:data:`SHARED`); configs with equal keys can
    train together."""
    return tuple((name, repr(getattr(config, name))) for name in SHARED)


@dataclass
class _State:
    """Where one member stands."""

    env_steps: int = 0
    steps_before_update: int = 0
    active: bool = True
    error: str | None = None  # why it stopped learning (a NaN/inf blow-up)


class Trainer:
    """M ≥ 1 members trained together (see the module docstring); :meth:`step` updates every
    active member once."""

    def __init__(self, configs: TrainConfig | Sequence[TrainConfig]) -> None:
        configs = [configs] if isinstance(configs, TrainConfig) else list(configs)
        if not configs:
            raise ValueError("a trainer needs at least one member")
        if len({population_key(c) for c in configs}) > 1:
            raise ValueError("members of one trainer must share " + ", ".join(SHARED))
        self.configs = configs
        shared = self.shared = configs[0]
        torch.set_num_threads(shared.torch_threads)  # process-wide (module docstring)
        members, per = len(configs), shared.num_envs
        if members > 1:
            keep_freed_memory()  # a population's updates reuse large blocks (agent/memory.py)
        self.size, self.envs_per_member = members, per
        self.device = torch.device(shared.device)
        self.env = make_vector_env(shared.env_id, members * per)
        space = self.env.single_action_space
        self.discrete = isinstance(space, gym.spaces.Discrete)
        self._bounds = None if self.discrete else (space.low, space.high)
        models = [self._model(c, c.seed, c.ortho_init) for c in configs]
        self.sde = models[0].sde
        self._by_hand = self._can_by_hand = gradient_by_hand(shared)
        # by hand: the rollout's actor activations (a list a layer, [M, E, width] a step)
        self._kept, self._kept_for = None, None
        self.actor = StackedMLP([m.actor for m in models]).to(self.device)
        self.critic = StackedMLP([m.critic for m in models]).to(self.device)
        self.log_std = None
        if not self.discrete:
            self.log_std = torch.stack([m.log_std.detach() for m in models]).to(self.device)
        self.parameters, self.log_std = one_buffer([self.actor, self.critic], self.log_std)
        self.optimizer = Optimizer([self.parameters], shared.optimizer, self._rates([0] * members))
        self.learner = Learner(configs, self.actor, self.critic, self.log_std, self.optimizer)
        obs_dim = self.env.single_observation_space.shape[0]
        self.normalizers = Normalizers(configs, per, obs_dim)
        seeds = [int(c.seed) for c in configs]
        self._rng = np.random.default_rng(seeds)
        self.capacity = shared.rollout_steps + -(-shared.rollout_steps // 4)  # (collect)
        self._rollout = self._batch = Rollout(self.capacity, members * per, self.env)
        raw, _ = self.env.reset(seed=seeds[0])
        self._obs = self.normalizers.reset(raw)
        self._reset_next = np.zeros(members * per, bool)
        self._tally = EpisodeTally(members * per, per)
        self._members = [_State() for _ in configs]
        # per column (sub-env) parameters of GAE and of the critic's target
        self._gamma = np.repeat([c.gamma for c in configs], per)
        self._lambda = np.repeat([c.lambda_ for c in configs], per)
        self._target_lambda = np.repeat([c.target_lambda for c in configs], per)
        self._started = time.perf_counter()
        self.updates = 0

    def _model(self, config: TrainConfig, seed: int, ortho_init: bool) -> ActorCritic:
        return ActorCritic(
            self.env.single_observation_space, self.env.single_action_space,
            config.hidden_sizes, seed, config.log_std_init, config.use_sde, ortho_init,
        )  # fmt: skip

    # -- the trainer as a whole -----------------------------------------------------------
    # the one switch between the routes: False forces autograd (tests); never by hand where
    # gradient_by_hand does not allow it (gSDE). A2C's by hand keeps the rollout's activations
    by_hand = property(lambda self: self._by_hand and self._can_by_hand,
                       lambda self, on: setattr(self, "_by_hand", on))  # fmt: skip
    _hand = property(lambda self: self.by_hand and self.shared.algo == "a2c")

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
        whose values, loss or gradient become NaN/inf is deactivated with :attr:`Member.error`
        set and left out of the result; the others are untouched by it."""
        started = time.perf_counter()
        before = [m.env_steps for m in self._members]
        for state in self._members:
            state.steps_before_update = state.env_steps
        active = [i for i, m in enumerate(self._members) if m.active]
        episodes = self.collect(active)
        metrics = self.update(active)
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

    # -- collect ------------------------------------------------------------------------------

    def collect(self, active: list[int]) -> dict[int, list[Episode]]:
        """Fill the rollout with every column's steps; return each active member's finished
        episodes.

        A member's budget ends in this rollout once it has counted ``need`` more env steps:
        from there its rows are invalid and its last row is a rollout end (a bootstrap), so no
        member overshoots its budget by ``num_envs`` steps or more. A rollout that can end every
        budget within :attr:`capacity` steps runs on until each is counted (reset rows do not
        count): a run never ends on a rollout of a few rows, which PPO would take ``n_epochs``
        passes over.

        NEXT_STEP autoreset: the step after an episode end only resets that env (action
        ignored, reward 0), so that row is invalid; the observation returned at an episode's
        end is its true final one, hence ``next_values[t] = values[t+1]`` in :meth:`estimate`.
        """
        shared, per, members = self.shared, self.envs_per_member, self.size
        need = np.zeros(members, np.int64)
        for i in active:
            need[i] = self.configs[i].total_steps - self._members[i].env_steps
        last = -(-need.max() // per) <= self.capacity
        steps = self.capacity if last else shared.rollout_steps
        rollout = self._batch = self._rollout.head(steps)
        obs, rng, normalizers = self._obs, self._rng, self.normalizers
        episodes: dict[int, list[Episode]] = {i: [] for i in active}
        live = np.zeros(members, bool)
        live[active] = True
        counted = np.zeros(members, np.int64)
        start = np.array([m.env_steps for m in self._members])
        may_end = bool((need[active] <= steps * per).any())  # else count after the loop
        live_columns = np.repeat(live, per)
        noise = self._sde_noise() if self.sde else None  # one matrix per env, redrawn below
        std = None  # a Gaussian policy's std, fixed for the rollout
        if not self.discrete and noise is None:
            std = np.repeat(host(self.log_std.exp()), per, 0)
        with torch.inference_mode():
            for t in range(steps):
                if noise is not None and t > 0:
                    self._redraw_sde_noise(noise, t)
                rollout.observations[t] = obs
                valid = ~self._reset_next
                rollout.valid[t] = valid & live_columns
                actions = self._sample(obs, rng, noise, t, std)
                rollout.actions[t] = actions
                env_actions = actions if self._bounds is None else np.clip(actions, *self._bounds)
                raw, rewards, terminated, truncated, _ = self.env.step(env_actions)
                scaled = normalizers.scale_rewards(rewards, terminated, truncated, live_columns)
                rollout.rewards[t] = scaled
                rollout.terminated[t] = terminated
                rollout.truncated[t] = truncated
                self._tally.add(rewards, valid)  # the env's own rewards
                self._reset_next = terminated | truncated
                obs = normalizers.observe(raw, self._reset_next, live_columns)
                if self._reset_next.any():
                    so_far = rollout.valid_rows(t + 1, members)
                    self._tally.finish(self._reset_next, live_columns, start + so_far, episodes)
                if not may_end:
                    continue
                counted += rollout.valid[t].reshape(members, per).sum(1)
                ended = live & (counted >= need)
                if ended.any():
                    rollout.truncated[t, np.repeat(ended, per)] = True  # its rollout ends here
                    live &= ~ended
                    live_columns = np.repeat(live, per)
                    if last and not live.any():
                        break
        if not may_end:
            counted = rollout.valid_rows(t + 1, members)
        rollout = self._batch = self._rollout.head(t + 1)
        rollout.observations[-1] = obs
        self._obs = obs
        self._kept_for = rollout if self._hand else None
        for i in active:
            self._members[i].env_steps += int(counted[i])
        return episodes

    def _sde_noise(self) -> torch.Tensor:
        """gSDE's exploration matrices, one per env: ``[M, E, F, A]``, entries ~ N(0, σ²)."""
        sigma = self.log_std.detach().exp().cpu().numpy()[:, None]  # [M, 1, F, A]
        shape = (self.size, self.envs_per_member, *sigma.shape[2:])
        draws = self._rng.standard_normal(shape).astype(np.float32)
        return torch.from_numpy(sigma * draws).to(self.device)

    def _redraw_sde_noise(self, noise: torch.Tensor, t: int) -> None:
        """New matrices for the members whose ``sde_sample_freq`` divides step ``t`` of the
        rollout (SB3's rule; -1 or 0: once per rollout)."""
        due = [i for i, c in enumerate(self.configs) if c.sde_sample_freq > 0
               and t % c.sde_sample_freq == 0]  # fmt: skip
        if due:
            fresh = self._sde_noise()
            noise[due] = fresh[due]

    def _sample(self, obs: np.ndarray, rng: np.random.Generator, noise, t: int, std) -> np.ndarray:
        """Every column's action (unclipped; the env sees a clipped copy) at rollout step t;
        ``std``: each column's Gaussian std ``[M·E, A]`` (None: logits)."""
        member_obs = torch.from_numpy(obs)
        if self.device.type != "cpu":
            member_obs = member_obs.to(self.device)
        member_obs = member_obs.view(self.size, self.envs_per_member, -1)
        if noise is not None:  # gSDE: μ(s) + φ(s)ᵀ W, W held for the rollout
            out, features = self.actor.with_features(member_obs)
            explore = (features[..., None] * noise).sum(-2)
            return host((out + explore).reshape(len(obs), -1)).astype(np.float32)
        if self._hand:
            outputs = self.actor.layers(member_obs)
            self._keep(outputs[1:], t)
            out = outputs[-1]
        else:
            out = self.actor(member_obs)
        return sample_actions(host(out.reshape(len(obs), -1)), rng, std)

    def _keep(self, activations: list[torch.Tensor], t: int) -> None:
        """Keep step ``t``'s actor activations ``[M, E, width]``; the update stacks each
        layer's steps in one call (:meth:`_kept_layers`), cheaper than a copy per step."""
        if t == 0:
            self._kept = [[] for _ in activations]
        for kept, h in zip(self._kept, activations, strict=True):
            kept.append(h)

    def _kept_layers(self, rows: int) -> list[torch.Tensor]:
        """The kept activations of the rollout's steps, member-major ``[M, T·E, width]``."""
        return [torch.stack(k, 1).reshape(self.size, rows, -1) for k in self._kept]

    # -- estimate and update --------------------------------------------------------------

    def by_member(self, x: np.ndarray | torch.Tensor) -> torch.Tensor:
        """``[T, M·E, ...]`` → ``[M, T·E, ...]`` (member-major rows), on the device (host
        values rearranged in NumPy, off torch's per-call dispatch)."""
        if isinstance(x, torch.Tensor) and x.device.type == "cpu" and not x.requires_grad:
            x = x.numpy()
        steps, members, per = x.shape[0], self.size, self.envs_per_member
        x = x.reshape(steps, members, per, *x.shape[2:]).swapaxes(0, 1)
        if isinstance(x, np.ndarray):
            x = torch.from_numpy(np.ascontiguousarray(x))
        return x.reshape(members, steps * per, *x.shape[3:]).to(self.device)

    def estimate(self, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """GAE advantages and the critic's targets ``[M, T·E]`` from the critic's values of
        all T+1 observations (``[M, (T+1)·E]``, detached), with each column's γ and λ."""
        rollout = self._batch
        steps = rollout.rewards.shape[0]
        members, per = self.size, self.envs_per_member
        values = values.reshape(members, steps + 1, per).transpose(0, 1)
        values = values.reshape(steps + 1, members * per)
        rewards, terminated, truncated = (
            torch.from_numpy(x).to(self.device)
            for x in (rollout.rewards, rollout.terminated, rollout.truncated)
        )
        inputs = (rewards, values[:-1], values[1:], terminated, truncated)

        def gae_of(lambda_: np.ndarray) -> torch.Tensor:  # right by construction: unchecked
            return gae(*inputs, gamma=self._gamma, lambda_=lambda_, validate=False)

        advantages = gae_of(self._lambda)
        same = np.array_equal(self._target_lambda, self._lambda)
        critic = advantages if same else gae_of(self._target_lambda)
        return self.by_member(advantages), self.by_member(critic + values[:-1])

    def update(self, active: list[int]) -> dict[int, dict[str, float]]:
        """Estimate and learn from the rollout just collected; each active member's metrics
        (a member that took no step, for want of a valid row, reports its learning rate only)."""
        rollout = self._batch
        steps, rows = rollout.rewards.shape[0], rollout.rewards.size // self.size  # T, T·E
        observations = self.by_member(rollout.observations)
        critic_pass = self.critic.layers(observations) if self._hand else None  # no graph
        if critic_pass is not None:
            all_values = critic_pass[-1].squeeze(-1)
        else:  # A2C's value loss by autograd reuses these values
            with torch.set_grad_enabled(self.shared.algo == "a2c"):
                all_values = self.critic(observations).squeeze(-1)
        detached = all_values.detach()
        finite = np.isfinite(host(detached)).all(1)  # (on the CPU a view: no torch call)
        self._fail({i: "critic values" for i in active if not finite[i]})
        shape = (steps, self.size, self.envs_per_member)  # a rollout's [T, M, E] columns
        rewarded = np.isfinite(rollout.rewards).reshape(shape).all((0, 2))  # (gae: unchecked)
        self._fail({i: "rewards" for i in active if not rewarded[i]})
        # a blown-up member's columns enter GAE as zeros: its results are never used
        if not finite.all():
            detached = torch.nan_to_num(detached, 0.0, 0.0, 0.0)
        advantages, returns = self.estimate(detached)
        mask = self.by_member(rollout.valid.astype(np.float32)).to(advantages.dtype)
        training = np.array([m.active for m in self._members])
        batch = Batch(
            observations=observations[:, :rows],
            actions=self.by_member(rollout.actions),
            advantages=advantages,
            returns=returns,
            values=all_values[:, :rows],
            mask=mask,
        )
        if critic_pass is not None:
            if self._kept is not None and self._kept_for is rollout:
                kept = self._kept_layers(rows)
            else:  # a rollout this trainer did not collect (a test's): the actor's pass anew
                kept = self.actor.layers(observations[:, :rows])[1:]
            batch.actor_pass = [observations[:, :rows], *kept]
            batch.critic_pass = [h[:, :rows] for h in critic_pass]
        spent = [m.steps_before_update for m in self._members]
        self.optimizer.learning_rate = self._rates(spent)
        learning = training & finite & rewarded & rollout.valid.reshape(shape).any((0, 2))
        result = self.learner.learn(batch, learning, training, spent, self.by_hand)
        self._fail({i: what for i, what in result.failures.items() if i in active})
        rates = self.optimizer.learning_rate  # one float, or each member's
        each = isinstance(rates, np.ndarray)
        out = {}
        for i in active:
            row = dict(result.metrics[i]) if result.stepped[i] else {}
            row[M.LEARNING_RATE.key] = float(rates[i] if each else rates)
            out[i] = row
        return out

    def _fail(self, failures: dict[int, str]) -> None:
        """End the members ``{index: what became non-finite}`` (each keeps its first reason)."""
        for i, what in failures.items():
            state = self._members[i]
            if state.error is not None:
                continue
            state.active = False
            state.error = (
                f"{TrainingDiverged.__name__}: {what} became non-finite at update {self.updates}"
            )

    def _rates(self, spent: Sequence[int]) -> float | np.ndarray:
        """Each member's step size for the coming update (its ``lr_schedule`` at its own share
        of its budget spent); one float when all are equal."""
        rates = np.array([scheduled(c.learning_rate, c.lr_schedule, s, c.total_steps)
                          for c, s in zip(self.configs, spent, strict=True)])  # fmt: skip
        return float(rates[0]) if (rates == rates[0]).all() else rates

    # -- members as runs: checkpoints, replays, evaluations, recordings ----------------------

    def model_of(self, index: int = 0) -> ActorCritic:
        """Member ``index``'s networks as a standalone :class:`ActorCritic` (a CPU copy)."""
        model = self._model(self.configs[index], 0, False)  # weights overwritten below
        self.actor.copy_into(model.actor, index)
        self.critic.copy_into(model.critic, index)
        if self.log_std is not None:
            with torch.no_grad():
                model.log_std.copy_(self.log_std[index].cpu())
        return model.eval()

    def replay(self, index: int = 0) -> Replay:
        """Member ``index``'s policy and critic now, with its normalisation frozen (a copy)."""
        state = self.normalizers.state(index)
        return Replay(
            self.model_of(index),
            obs_mean=state.get("obs_mean"),
            obs_var=state.get("obs_var"),
            return_var=float(state["return_var"]) if "return_var" in state else None,
            clip=self.configs[index].normalize_clip,
        )

    def checkpoint_bytes(self, index: int = 0) -> bytes:
        """Member ``index``'s weights and normalisation statistics now (a pure read;
        :func:`~gae_core.agent.recording.load_replay` reads it back)."""
        return checkpoint_bytes(self.model_of(index), self.normalizers.state(index))

    def evaluate(self, index: int, episodes: int, seed: int) -> list[float]:
        """Member ``index``'s deterministic episodes (argmax / mean actions) on a fresh vector
        env reset with ``seed``, normalisation frozen; training is untouched."""
        return evaluate_replays([self.replay(index)], self.shared.env_id, episodes, [seed])[0]

    def record(self, index: int, episodes: int, seed: int) -> list[Trajectory]:
        """Member ``index``'s episodes (sampled actions) on a fresh env, normalisation frozen;
        the training envs and generator are untouched."""
        replays = [self.replay(index)]
        return record_replays_together(replays, self.shared.env_id, episodes, [seed])[0]


class Member:
    """One member of a :class:`Trainer`, seen as a run."""

    def __init__(self, trainer: Trainer, index: int) -> None:
        self.trainer, self.index = trainer, index
        self.config = trainer.configs[index]
        self._state = trainer._members[index]

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
        """Its last update crossed a multiple of ``checkpoint_every`` env steps (a pure read)."""
        return self._crossed(self.config.checkpoint_every)

    def evaluation_due(self) -> bool:
        """Its last update crossed a multiple of ``eval_every`` env steps (a pure read)."""
        return self._crossed(self.config.eval_every)
