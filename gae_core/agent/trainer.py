"""A2C with GAE(γ, λ) advantages (Mnih et al. 2016 with Schulman et al. 2016, arXiv:1506.02438).

One update per rollout, as a plain object a test can step:

    collect()   N envs × T steps with the current policy, one actor forward pass per vector step
    estimate()  V on all T+1 observations in one batch, then ``estimators.gae`` → advantages
                and the critic's target (λ-returns with ``config.target_lambda``)
    update()    one gradient step on policy loss + value_coef·value loss − entropy_coef·entropy

Two engines compute the passes and gradients: on the CPU (without gSDE) the NumPy engine of
:mod:`gae_core.agent.numpy_a2c` with hand-derived gradients, several times less overhead per op
at a preset's few dozen rows; otherwise torch autograd. They agree to float rounding (tests).

The critic's target is a choice the run records (``critic_target``): λ-returns with the
advantage's λ, as SB3 and CleanRL do, or with a λ of its own; ``critic_lambda`` 1.0 is the paper's
choice (eq. 28: V regressed on discounted returns, bootstrapped where an episode is cut and at the
rollout end). A λ study holds it fixed, so that it varies λ and nothing else.

Deviations from the paper, all standard in A2C implementations: the paper fits the policy with
TRPO and the critic with a trust-region regression on full batches; here both take one
(Adam/RMSprop) gradient step per rollout on a shared loss, advantages are optionally
standardised per batch, and the gradient norm is clipped. Observations and rewards may be
normalised with gymnasium's wrappers (``gae_core.agent.envs``): the rollout then holds normalised
observations and scaled rewards for learning, while episode returns count the env's own rewards.

Determinism: for a given config (seed and ``torch_threads`` included) ``step()`` yields the same
metrics. Weights are initialised from a local ``torch.Generator`` and actions are sampled from
a local ``np.random.Generator``, so concurrent runs in other threads do not perturb each other;
``torch.set_num_threads`` and the NumPy engine's BLAS thread limit are process-wide however:
the last trainer built sets them for all.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch

from gae_core import metrics as M
from gae_core.agent.config import TrainConfig
from gae_core.agent.envs import make_training_env
from gae_core.agent.numpy_a2c import NumpyA2C, supports
from gae_core.agent.optim import Optimizer
from gae_core.agent.policy import ActorCritic
from gae_core.agent.recording import Replay, checkpoint_bytes, evaluate_replay, record_replay
from gae_core.estimators import gae
from gae_core.trajectory import Trajectory

__all__ = ["Episode", "Rollout", "StepResult", "Trainer", "TrainingDiverged", "explained_variance"]


class TrainingDiverged(RuntimeError):
    """A loss, gradient or value became NaN or infinite; the run cannot continue."""


@dataclass(frozen=True)
class Episode:
    """One finished training episode: the env step at which it ended, its return and length."""

    env_step: int
    return_: float
    length: int


@dataclass
class StepResult:
    """What one ``Trainer.step()`` produced."""

    env_steps: int
    metrics: dict[str, float]
    episodes: list[Episode]


class Rollout:
    """Preallocated time-major buffers for one rollout (reused every update)."""

    def head(self, steps: int) -> Rollout:
        """Views of the first ``steps`` rows (and ``steps + 1`` observations): the last rollout
        of a run is cut so the run stops at its budget instead of a whole rollout past it."""
        view = object.__new__(Rollout)
        view.observations = self.observations[: steps + 1]
        for name in ("actions", "rewards", "terminated", "truncated", "valid"):
            setattr(view, name, getattr(self, name)[:steps])
        return view

    def __init__(self, steps: int, num_envs: int, env: gym.vector.VectorEnv) -> None:
        obs_dim = env.single_observation_space.shape[0]
        action_space = env.single_action_space
        # Row T holds the observation after the last step: the bootstrap for V(s_T).
        self.observations = np.zeros((steps + 1, num_envs, obs_dim), np.float32)
        if isinstance(action_space, gym.spaces.Discrete):
            self.actions = np.zeros((steps, num_envs), np.int64)
        else:
            self.actions = np.zeros((steps, num_envs, action_space.shape[0]), np.float32)
        self.rewards = np.zeros((steps, num_envs), np.float32)
        self.terminated = np.zeros((steps, num_envs), bool)
        self.truncated = np.zeros((steps, num_envs), bool)
        # False on NEXT_STEP reset rows (the step after an episode end; see gae_core.agent.envs).
        self.valid = np.ones((steps, num_envs), bool)


class Trainer:
    """A2C+GAE on a gymnasium vector env; see the module docstring and docs/DESIGN.md."""

    def __init__(self, config: TrainConfig, *, autograd: bool = False) -> None:
        """``autograd``: train on torch autograd even where the NumPy engine applies (tests
        and ``benchmarks/bench_train.py`` compare the two engines side by side)."""
        self.config = config
        torch.set_num_threads(config.torch_threads)  # process-wide, see module docstring
        self.device = torch.device(config.device)
        self.stack = make_training_env(
            config.env_id,
            config.num_envs,
            normalize_observations=config.normalize_observations,
            normalize_rewards=config.normalize_rewards,
            gamma=config.gamma,
            clip=config.normalize_clip,
            reset_at_truncation=config.reward_norm_reset == "episode_end",
        )
        self.env = self.stack.env
        self.model = ActorCritic(
            self.env.single_observation_space,
            self.env.single_action_space,
            config.hidden_sizes,
            config.seed,
            config.log_std_init,
            config.use_sde,
            config.ortho_init,
        ).to(self.device)
        # On the CPU the passes and gradients run in NumPy on a flat buffer (numpy_a2c: several
        # times less per-op overhead at a preset's few dozen rows); the optimizer steps that
        # buffer. gSDE and other devices run on torch autograd.
        self._numpy = (
            NumpyA2C(self.model, config.torch_threads)
            if supports(config.use_sde, config.device) and not autograd
            else None
        )
        params = [self._numpy.flat] if self._numpy else list(self.model.parameters())
        self.optimizer = Optimizer(params, config.optimizer, config.learning_rate)
        self._rng = np.random.default_rng(config.seed)
        self._rollout = Rollout(config.rollout_steps, config.num_envs, self.env)
        self._batch = self._rollout  # the rows of the rollout being processed
        action_space = self.env.single_action_space
        self._action_bounds = (
            None
            if isinstance(action_space, gym.spaces.Discrete)
            else (action_space.low, action_space.high)
        )
        self._obs, _ = self.env.reset(seed=config.seed)
        self._reset_next = np.zeros(config.num_envs, bool)  # next row is a reset row
        self._episode_returns = np.zeros(config.num_envs, np.float64)
        self._episode_lengths = np.zeros(config.num_envs, np.int64)
        self._steps_before_update = 0
        self._values: torch.Tensor | None = None  # estimate's critic pass (with its graph)
        self._started = time.perf_counter()
        self.env_steps = 0
        self.updates = 0

    @property
    def engine(self) -> str:
        """Which engine computes the passes and gradients: "numpy" or "autograd"."""
        return "autograd" if self._numpy is None else "numpy"

    @property
    def done(self) -> bool:
        return self.env_steps >= self.config.total_steps

    def step(self) -> StepResult:
        """One update: collect → estimate → update. Raises ``TrainingDiverged`` on NaN/inf."""
        started, steps_before = time.perf_counter(), self.env_steps
        self._steps_before_update = steps_before
        episodes = self.collect()
        advantages, returns = self.estimate()
        metrics = self.update(advantages, returns)
        self.updates += 1
        now = time.perf_counter()
        metrics[M.STEPS_PER_SECOND.key] = (self.env_steps - steps_before) / (now - started)
        metrics[M.WALL_TIME.key] = now - self._started
        return StepResult(self.env_steps, metrics, episodes)

    def collect(self) -> list[Episode]:
        """Fill the rollout buffers with ``rollout_steps`` vector steps (fewer for the last
        rollout, so the run ends within ``num_envs`` steps of its budget); return the episodes
        that finished.

        NEXT_STEP autoreset: the step after an episode end only resets that env (action ignored,
        reward 0), so that row is marked invalid. The observation returned at the end of an
        episode is the true final one, hence ``next_values[t] = values[t+1]`` in ``estimate``.
        """
        config = self.config
        remaining = -(-(config.total_steps - self.env_steps) // config.num_envs)  # ceil
        # only the rollout that crosses the budget is cut; stepping past it (a caller that
        # ignores ``done``) runs whole rollouts as before
        steps = config.rollout_steps if remaining <= 0 else min(config.rollout_steps, remaining)
        rollout = self._batch = self._rollout.head(steps)
        model, env, rng = self.model, self.env, self._rng
        obs, on_cpu, fast = self._obs, self.device.type == "cpu", self._numpy
        episodes: list[Episode] = []
        # gSDE: one exploration matrix per env for the whole rollout (SB3's sde_sample_freq -1)
        noise = model.sde_noise(config.num_envs, rng) if model.sde else None
        with torch.inference_mode():
            for t in range(steps):
                rollout.observations[t] = obs
                valid = ~self._reset_next
                rollout.valid[t] = valid
                if fast is not None:
                    actions = fast.sample(obs, rng)
                else:
                    obs_tensor = (
                        torch.from_numpy(obs)
                        if on_cpu
                        else torch.as_tensor(obs, device=self.device)
                    )
                    actions = model.sample(obs_tensor, rng, noise)
                rollout.actions[t] = actions
                obs, rewards, terminated, truncated, _ = env.step(self._env_actions(actions))
                rollout.rewards[t] = rewards  # scaled when rewards are normalised
                rollout.terminated[t] = terminated
                rollout.truncated[t] = truncated
                self._episode_returns += self.stack.raw.rewards  # the env's own
                self._episode_lengths += valid
                self._reset_next = terminated | truncated
                if self._reset_next.any():
                    episodes.extend(self._finish_episodes(t))
        rollout.observations[-1] = obs
        self._obs = obs
        self.env_steps += int(rollout.valid.sum())
        return episodes

    def estimate(self) -> tuple[torch.Tensor, torch.Tensor]:
        """GAE advantages and the critic's targets ``[T, N]`` for the rollout just collected:
        λ-returns with the advantage's λ, or with ``critic_lambda`` (see the module docstring)."""
        rollout, config = self._batch, self.config
        device = self.device
        # One critic pass over all T+1 observations per update: its detached values feed GAE
        # and, kept with their graph, the valid rows' values are what ``update``'s value loss
        # trains (as in a population; measured: 0.2 ms of a 3.5 ms CartPole update saved).
        if self._numpy is not None:
            numpy_values = self._numpy.values(rollout.observations)
            finite = np.isfinite(numpy_values).all()
            all_values = torch.from_numpy(numpy_values)
        else:
            observations = torch.as_tensor(rollout.observations, device=device)
            self._values = self.model.values(observations)  # [T+1, N], differentiable
            all_values = self._values.detach()
            finite = torch.isfinite(all_values).all()
        if not finite:
            raise TrainingDiverged(f"critic values became non-finite at update {self.updates}")
        values, next_values = all_values[:-1], all_values[1:]
        # Torch tensors in: gae runs on the rollout's device (on the CPU a NumPy loop for short
        # rollouts, else a doubling scan), so a training process never loads the numba runtime
        # (see estimators.TORCH_CPU_MAX_ELEMENTS).
        inputs = (
            torch.as_tensor(rollout.rewards, device=device),
            values,
            next_values,
            torch.as_tensor(rollout.terminated, device=device),
            torch.as_tensor(rollout.truncated, device=device),
        )
        advantages = gae(*inputs, gamma=config.gamma, lambda_=config.lambda_)
        target = config.target_lambda
        critic = (
            advantages
            if target == config.lambda_
            else gae(*inputs, gamma=config.gamma, lambda_=target)
        )
        return advantages.cpu(), (critic + values).cpu()

    def update(self, advantages: torch.Tensor, returns: torch.Tensor) -> dict[str, float]:
        """One gradient step on the valid rows; returns the loss metrics.

        A rollout with no valid row (``rollout_steps`` 1 and every env just reset) has nothing
        to learn from: no step is taken and only the learning rate is reported (no loss was
        measured; a stored row's mean leaves the update out, :class:`~gae_core.runs.execute.
        UpdateLog`).
        """
        self.optimizer.learning_rate = self.learning_rate()
        if not self._batch.valid.any():
            return {M.LEARNING_RATE.key: self.optimizer.learning_rate}
        if self._numpy is not None:
            return self._numpy_update(advantages.numpy(), returns.numpy())
        observations, actions, advantages, returns, values = self._valid_rows(advantages, returns)
        raw_advantages = advantages
        if self.config.normalize_advantages and advantages.numel() > 1:
            advantages = (advantages - advantages.mean()) / (advantages.std(correction=0) + 1e-8)
        losses, values = self._losses(observations, actions, advantages, returns, values)
        self.optimizer.zero_grad()
        losses["loss"].backward()
        return self._metrics(
            {name: term.item() for name, term in losses.items()},
            explained_variance(values, returns.cpu()),
            (raw_advantages.mean().item(), raw_advantages.std(correction=0).item()),
            self._clip_and_step(),
        )

    def _numpy_update(self, advantages: np.ndarray, returns: np.ndarray) -> dict[str, float]:
        """:meth:`update` on the NumPy engine: the same loss on the same valid rows."""
        batch, config = self._batch, self.config
        valid = batch.valid.reshape(-1)
        rows = np.flatnonzero(valid)
        observations = batch.observations[:-1].reshape(len(valid), -1)[rows]
        actions = batch.actions.reshape(len(valid), *batch.actions.shape[2:])[rows]
        raw_advantages, returns = advantages.reshape(-1)[rows], returns.reshape(-1)[rows]
        advantages = raw_advantages
        if config.normalize_advantages and len(rows) > 1:
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        terms, values = self._numpy.gradients(
            observations, actions, advantages, returns, rows,
            config.value_coef, config.entropy_coef,
        )  # fmt: skip
        if not math.isfinite(terms["loss"]):
            raise TrainingDiverged(f"loss became {terms['loss']} at update {self.updates}")
        return self._metrics(
            terms,
            explained_variance(values, returns),
            (float(raw_advantages.mean()), float(raw_advantages.std())),
            self._clip_and_step(),
        )

    def _metrics(
        self,
        terms: dict[str, float],
        explained: float,
        advantage_moments: tuple[float, float],
        grad_norm: float,
    ) -> dict[str, float]:
        return {
            M.POLICY_LOSS.key: terms["policy"],
            M.VALUE_LOSS.key: terms["value"],
            M.ENTROPY.key: terms["entropy"],
            M.EXPLAINED_VARIANCE.key: explained,
            M.ADVANTAGE_MEAN.key: advantage_moments[0],
            M.ADVANTAGE_STD.key: advantage_moments[1],
            M.GRAD_NORM.key: grad_norm,
            M.LEARNING_RATE.key: self.optimizer.learning_rate,
        }

    def learning_rate(self) -> float:
        """The step size of the coming update: constant, or decayed linearly with the share of
        the budget spent (SB3's ``lin_`` schedules use the same progress)."""
        config = self.config
        if config.lr_schedule == "constant":
            return config.learning_rate
        remaining = 1.0 - min(1.0, self._steps_before_update / config.total_steps)
        return config.learning_rate * remaining

    def _valid_rows(
        self, advantages: torch.Tensor, returns: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        """Flatten ``[T, N]`` to rows and drop the NEXT_STEP reset rows; tensors on the device:
        observations, actions, advantages, returns and the critic's values (differentiable,
        from :meth:`estimate`'s pass)."""
        rollout, device = self._batch, self.device
        valid = torch.from_numpy(rollout.valid.reshape(-1))
        rows = valid.shape[0]
        observations = torch.from_numpy(rollout.observations[:-1].reshape(rows, -1))
        actions = torch.from_numpy(rollout.actions.reshape(rows, *rollout.actions.shape[2:]))
        rows_out = tuple(
            x[valid].to(device)
            for x in (observations, actions, advantages.reshape(-1), returns.reshape(-1))
        )
        return (*rows_out, self._values[:-1].reshape(-1)[valid.to(device)])

    def _losses(
        self,
        observations: torch.Tensor,
        actions: torch.Tensor,
        advantages: torch.Tensor,
        returns: torch.Tensor,
        values: torch.Tensor,
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """A2C loss terms (differentiable) and the critic's values (detached, CPU)."""
        config = self.config
        log_probs, entropy = self.model.log_probs_and_entropy(observations, actions)
        policy = -(advantages * log_probs).mean()
        # The critic regresses on λ-returns with config.target_lambda (1.0: the paper's
        # discounted returns, eq. 28). MSE as in SB3 (CleanRL halves it).
        value = (returns - values).square().mean()
        entropy = entropy.mean()
        loss = policy + config.value_coef * value - config.entropy_coef * entropy
        if not torch.isfinite(loss):
            raise TrainingDiverged(f"loss became {loss.item()} at update {self.updates}")
        terms = {"loss": loss, "policy": policy, "value": value, "entropy": entropy}
        return terms, values.detach().cpu()

    def _clip_and_step(self) -> float:
        """Clip the global gradient norm, step; returns the norm before clipping."""
        max_norm = self.config.max_grad_norm if self.config.max_grad_norm > 0 else float("inf")
        if self._numpy is not None:
            grad_norm = self._numpy.clip(max_norm)
        else:
            grad_norm = torch.nn.utils.clip_grad_norm_(self.optimizer.params, max_norm).item()
        if not math.isfinite(grad_norm):
            raise TrainingDiverged(f"gradient norm became {grad_norm} at update {self.updates}")
        self.optimizer.step()
        return grad_norm

    def checkpoint_due(self) -> bool:
        """True when the last update crossed a multiple of ``checkpoint_every`` env steps.

        A pure read: asking, or saving a checkpoint, never moves the schedule.
        """
        every = self.config.checkpoint_every
        return every > 0 and self.env_steps // every > self._steps_before_update // every

    def evaluation_due(self) -> bool:
        """True when the last update crossed a multiple of ``eval_every`` env steps (pure)."""
        every = self.config.eval_every
        return every > 0 and self.env_steps // every > self._steps_before_update // every

    def checkpoint_bytes(self) -> bytes:
        """The model's weights and the normalisation statistics of this moment (a pure read;
        :func:`gae_core.agent.recording.load_replay` reads it back)."""
        return checkpoint_bytes(self.model, self.stack.normalization_state())

    def replay(self) -> Replay:
        """The current policy with the current normalisation statistics frozen (a copy)."""
        state = self.stack.normalization_state()
        return Replay(
            self.model,
            obs_mean=state.get("obs_mean"),
            obs_var=state.get("obs_var"),
            return_var=float(state["return_var"]) if "return_var" in state else None,
            clip=self.config.normalize_clip,
            device=self.device,
        )

    def evaluate(self, episodes: int, seed: int) -> list[float]:
        """Returns of ``episodes`` deterministic episodes (argmax / mean actions), one per env of
        a fresh vector env reset with ``seed``, normalisation frozen; training is untouched."""
        return evaluate_replay(self.replay(), self.config.env_id, episodes, seed)

    def record(self, episodes: int, seed: int) -> list[Trajectory]:
        """``episodes`` episodes with the current policy (sampled actions) on a fresh single env,
        normalisation frozen; the training envs and RNG are untouched, so training stays
        deterministic."""
        return record_replay(self.replay(), self.config.env_id, episodes, seed)

    def close(self) -> None:
        self.stack.close()

    def _env_actions(self, actions: np.ndarray) -> np.ndarray:
        # Clip only what the env sees; the buffer keeps the sample whose log-prob we train on.
        if self._action_bounds is None:
            return actions
        return np.clip(actions, *self._action_bounds)

    def _finish_episodes(self, t: int) -> list[Episode]:
        at_step = self.env_steps + int(self._rollout.valid[: t + 1].sum())
        finished = []
        for i in np.flatnonzero(self._reset_next):
            finished.append(
                Episode(at_step, float(self._episode_returns[i]), int(self._episode_lengths[i]))
            )
            self._episode_returns[i] = 0.0
            self._episode_lengths[i] = 0
        return finished


def explained_variance(values: np.ndarray, returns: np.ndarray) -> float:
    """1 − Var(returns − values) / Var(returns); 0.0 when the returns do not vary (undefined).
    NumPy arrays or tensors (detached and read on the CPU)."""
    values, returns = (
        x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
        for x in (values, returns)
    )
    variance = float(returns.var())
    if variance == 0.0:
        return 0.0
    return 1.0 - float((returns - values).var()) / variance
