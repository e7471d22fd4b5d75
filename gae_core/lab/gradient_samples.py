"""The samples the gradient lens (:mod:`gae_core.lab.gradient`) measures on, and the
per-sample scores it builds every gradient from: K batches drawn as training draws them (env
copies with time-limit resets, windows of ``steps`` steps at random points of the episode
stream) and the reference's whole episodes with Monte-Carlo returns followed past the time
limit."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from gae_core.agent.envs import episode_cap, make_eval_env, make_vector_env
from gae_core.agent.recording import Replay
from gae_core.estimators import gae_lambda_sweep, k_step_advantages
from gae_core.lab.rollouts import Progress
from gae_core.lab.states import Simulator

#: Blocks of reference episodes whose spread gives the reference's own noise.
REFERENCE_BLOCKS = 32
#: Env copies the reference plays at once: it ends a round of whole episodes, so it can take
#: up to this many episodes' samples more than asked (the lab page's caption says so).
REFERENCE_COPIES = 256
#: Samples whose scores are held at once (a [chunk, parameters] float32 block, with vmap's
#: per-layer gradients beside it): 2,048 keeps HalfCheetah's lens at 1.53 GB peak where 8,192
#: took 2.14 GB, at the same speed (docs/PERFORMANCE.md).
SCORE_CHUNK = 2048
#: The progress a unit of each part of the lens counts, against a reference sample's 1 (its
#: env step, its score and its Monte-Carlo return): an env step of a batch's window (no score
#: yet), and a batch sample's gradient for one critic (its score and every estimator's
#: advantages), in the ratio of their measured costs (docs/PERFORMANCE.md, "The gradient
#: lens's ETA"), so that the ETA, elapsed time over the share done, holds from the start.
WINDOW_STEP_COST, BATCH_SAMPLE_COST = 0.2, 0.9
#: The share of a reference sample's 1 counted when its step is played; the rest when its
#: score is taken, at the end of its round of episodes (most of its cost on CartPole).
REFERENCE_STEP_SHARE = 0.3

# ----------------------------------------------------------------------------- scores


class _LogProb(nn.Module):
    """log π(a|s) of an :class:`~gae_core.agent.policy.ActorCritic` as a module's forward, for
    ``torch.func.functional_call``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return self.model.log_probs_and_entropy(obs, actions)[0]


def actor_parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    """The parameters log π depends on (the actor's layers and the log-std), detached."""
    return {
        f"model.{name}": p.detach()
        for name, p in model.named_parameters()
        if name.startswith("actor.") or name == "log_std"
    }


def per_sample_scores(model: nn.Module, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """Ψ ``[n, P]``: row i is ∇_θ log π(a_i|s_i) over :func:`actor_parameters` (flattened in
    their order), by ``torch.func.vmap(grad(…))`` in chunks of :data:`SCORE_CHUNK`."""
    wrapper = _LogProb(model)
    params = actor_parameters(model)

    def log_prob(p: dict[str, torch.Tensor], o: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(wrapper, p, (o.unsqueeze(0), a.unsqueeze(0)))[0]

    scores = torch.func.vmap(torch.func.grad(log_prob), in_dims=(None, 0, 0))
    parts = []
    for start in range(0, len(obs), SCORE_CHUNK):
        part = slice(start, start + SCORE_CHUNK)
        rows = scores(params, obs[part], actions[part])
        parts.append(torch.cat([g.reshape(g.shape[0], -1) for g in rows.values()], dim=1))
    return torch.cat(parts) if parts else torch.zeros((0, sum(p.numel() for p in params.values())))


def batch_gradients(scores: torch.Tensor, advantages: np.ndarray) -> np.ndarray:
    """``[E, P]``: each estimator's gradient (1/n) Σ_i ψ_i Â_i, ``advantages [E, n]``."""
    weights = torch.as_tensor(np.asarray(advantages, np.float32))
    return (weights @ scores).double().numpy() / max(scores.shape[0], 1)


# ----------------------------------------------------------------------------- rollouts


@dataclass
class Windows:
    """K windows of ``envs × steps`` samples: network inputs, actions, advantages per
    estimator ``[E, n]`` per critic (filled later) and which rows are real samples."""

    obs: np.ndarray  # [K, steps, envs, obs_dim] raw observations
    next_obs: np.ndarray  # [K, steps, envs, obs_dim]
    actions: np.ndarray  # [K, steps, envs, ...]
    rewards: np.ndarray  # [K, steps, envs]
    terminated: np.ndarray
    truncated: np.ndarray
    valid: np.ndarray  # False on a copy's reset row (NEXT_STEP autoreset)


def _clip(space: gym.Space, actions: np.ndarray) -> np.ndarray:
    return np.clip(actions, space.low, space.high) if isinstance(space, gym.spaces.Box) else actions


def sample_windows(env_id: str, policy: Replay, batches: int, envs: int, steps: int, seed: int,
             progress: Progress) -> Windows:  # fmt: skip
    """Each batch's envs copies run a burn-in of one time limit plus a random offset of up to
    another, then record ``steps`` steps (one vector env of ``batches × envs`` copies)."""
    rng = np.random.default_rng([seed, 1])
    probe = make_eval_env(env_id)
    cap = episode_cap(probe)
    probe.close()
    copies = batches * envs
    start = cap + rng.integers(0, cap, size=batches).repeat(envs)  # per batch
    env = make_vector_env(env_id, copies)
    obs, _ = env.reset(seed=seed)
    space = env.single_action_space
    shape = (steps, copies)
    rec_obs = np.zeros((*shape, *obs.shape[1:]), np.float32)
    rec_next = np.zeros_like(rec_obs)
    rec_act = np.zeros((*shape, *space.shape), space.dtype if space.shape else np.int64)
    rewards, terminated, truncated = (np.zeros(shape), np.zeros(shape, bool), np.zeros(shape, bool))
    valid = np.zeros(shape, bool)
    done = np.zeros(copies, bool)  # the copy's last step ended an episode: this one resets it
    total = int(start.max()) + steps
    columns = np.arange(copies)
    try:
        for t in range(total):
            actions = policy.sample(obs, rng)
            next_obs, reward, term, trunc, _ = env.step(_clip(space, actions))
            row = t - start
            inside = (row >= 0) & (row < steps)
            if inside.any():
                r, c = row[inside], columns[inside]
                rec_obs[r, c], rec_next[r, c], rec_act[r, c] = obs[c], next_obs[c], actions[c]
                rewards[r, c], terminated[r, c], truncated[r, c] = reward[c], term[c], trunc[c]
                valid[r, c] = ~done[c]
            done = term | trunc
            obs = next_obs
            progress.step(copies * WINDOW_STEP_COST)
    finally:
        env.close()
    truncated |= ~valid  # a reset row is its own segment; its sample is left out

    def split(a: np.ndarray) -> np.ndarray:  # [steps, K·envs, …] → [K, steps, envs, …]
        return np.moveaxis(a.reshape(steps, batches, envs, *a.shape[2:]), 1, 0)

    return Windows(*(split(a) for a in (rec_obs, rec_next, rec_act, rewards, terminated,
                                         truncated, valid)))  # fmt: skip


def window_advantages(w: Windows, critic: Replay, k: int, settings: Any) -> np.ndarray:
    """``[E, n]`` advantages of batch k's valid samples, every estimator, with ``critic``."""
    steps, envs = w.rewards.shape[1:]
    obs = w.obs[k].reshape(steps * envs, -1)
    values = critic.values(obs).astype(np.float64).reshape(steps, envs)
    next_values = critic.values(w.next_obs[k].reshape(steps * envs, -1)).astype(np.float64)
    args = (w.rewards[k], values, next_values.reshape(steps, envs), w.terminated[k],
            w.truncated[k])  # fmt: skip
    parts = [gae_lambda_sweep(*args, gamma=settings.gamma, lambdas=list(settings.lambdas))]
    parts += [k_step_advantages(*args, gamma=settings.gamma, k=int(x))[None] for x in settings.ks]
    out = np.concatenate(parts)  # [E, steps, envs]
    return out[:, w.valid[k]]


def reference_gradient(
    env_id: str,
    policy: Replay,
    critic: Replay,
    settings: Any,
    progress: Progress,
    copies: int = REFERENCE_COPIES,
) -> tuple[np.ndarray, float, int]:
    """(g*, tr Cov(ĝ*), samples): whole episodes from the env's start distribution, every step
    up to the time limit a sample, Monte-Carlo advantages past the limit (module docstring)."""
    rng = np.random.default_rng([settings.seed, 2])
    probe = make_eval_env(env_id)
    cap = episode_cap(probe)
    probe.close()
    horizon = cap + settings.horizon
    sim = Simulator(env_id, copies, seed=settings.seed)
    total, blocks, counts = None, None, np.zeros(REFERENCE_BLOCKS)
    samples, round_ = 0, 0
    # its share of the progress, settings.reference, spread over the rounds it will take: a
    # round plays whole episodes, so the last one overshoots (up to copies × cap samples)
    units_left, per_round = float(settings.reference), copies * cap  # (at most, at first)

    def tick(count: float) -> None:
        nonlocal units_left
        units = min(units_left, count * scale)
        units_left -= units
        progress.step(units)  # (and a cancel takes effect)

    try:
        while samples < settings.reference:
            rounds_left = max(1, math.ceil((settings.reference - samples) / per_round))
            scale = units_left / (rounds_left * per_round)
            obs = sim.reset(seed=settings.seed + 7919 * (round_ + 1))
            rec_obs, rec_act, rec_rew, alive_rows = [], [], [], []
            alive = np.ones(copies, bool)
            for _ in range(horizon):
                actions = policy.sample(obs, rng)
                rec_obs.append(obs)
                rec_act.append(actions)
                alive_rows.append(alive.copy())
                obs, reward, term = sim.step(actions)
                rec_rew.append(np.where(alive, reward, 0.0))
                tick(REFERENCE_STEP_SHARE * alive.sum() if len(rec_rew) <= cap else 0)
                alive &= ~term
                if not alive.any():
                    break
            rows = len(rec_rew)
            rew = np.stack(rec_rew)  # [rows, copies]
            returns = np.zeros_like(rew)  # G_t = r_t + γ G_{t+1}, backwards (any γ, no underflow)
            following = np.zeros(copies)
            for t in range(rows - 1, -1, -1):
                following = rew[t] + settings.gamma * following
                returns[t] = following
            alive_at = np.stack(alive_rows)
            sample = alive_at & (np.arange(rows)[:, None] < cap)
            t_idx, c_idx = np.nonzero(sample)
            o = np.stack(rec_obs)[t_idx, c_idx]
            a = np.stack(rec_act)[t_idx, c_idx]
            advantage = returns[t_idx, c_idx] - critic.values(o).astype(np.float64)
            block = (c_idx + round_ * copies) % REFERENCE_BLOCKS
            for start in range(0, len(o), SCORE_CHUNK):
                part = slice(start, start + SCORE_CHUNK)
                scores = per_sample_scores(
                    policy.model, policy.policy_input(o[part]), action_tensor(a[part])
                )
                scores.mul_(torch.as_tensor(advantage[part], dtype=torch.float32)[:, None])
                sums = torch.zeros((REFERENCE_BLOCKS, scores.shape[1]))
                sums.index_add_(0, torch.as_tensor(block[part]), scores)
                sums = sums.double().numpy()  # chunks add up in float64
                blocks = sums if blocks is None else blocks + sums
                tick((1.0 - REFERENCE_STEP_SHARE) * len(scores))
            counts += np.bincount(block, minlength=REFERENCE_BLOCKS)
            samples += len(o)
            per_round = max(len(o), 1)  # the next rounds are like this one
            round_ += 1
        progress.step(units_left)  # what the estimate left over
    finally:
        sim.close()
    total = blocks.sum(0) / samples
    used = counts > 0
    means = blocks[used] / counts[used, None]
    share = counts[used] / samples
    r = int(used.sum())
    noise = float((share**2 * ((means - total) ** 2).sum(1)).sum() * r / max(r - 1, 1))
    return total, noise, samples


def action_tensor(actions: np.ndarray) -> torch.Tensor:
    actions = np.asarray(actions)
    return torch.as_tensor(actions if actions.dtype.kind in "iu" else actions.astype(np.float32))
