r"""The gradient lens: what λ does to the policy-gradient estimate itself, not only to each
state's advantage (Ilyas et al., "A Closer Look at Deep Policy Gradients", 2020, measured batch
gradients against a "true" one; here per λ, with intervals).

For a policy checkpoint π_θ and a critic V̂:

* **The batch estimator.** A batch is what training computes one update from: ``envs`` env
  copies stepped ``steps`` times with π (time limits reset a copy, as in training), GAE(γ, λ)
  (or Â^(k)) with V̂ bootstrapping at a truncation and at the window's end, and

  .. math::  ĝ_λ = \frac{1}{n} \sum_i ∇_θ \log π_θ(a_i|s_i)\, Â^λ_i

  over its n samples (the policy-gradient term of the loss, unnormalised advantages). K
  independent batches start at independent, uniformly spread points of the env's episode stream
  (a burn-in of one time limit, then a random offset up to another).
* **The reference.** g* is the same average over ≥ ``reference`` samples from whole episodes
  (each step of an episode up to the time limit counts once: the stream's state distribution),
  with Monte-Carlo advantages G_t − V̂(s_t), G_t the discounted return followed past the time
  limit until γ^H ≤ 10⁻³ (time limits are not part of the state, as the lab's truth). Its noise
  ``reference_noise`` = tr Cov(ĝ*) is estimated from 32 blocks of episodes.
* **Per-sample scores once.** ψ_i = ∇_θ log π(a_i|s_i) for every sample of a batch come from
  one ``torch.func.vmap(grad(…))``; every estimator's gradient is then one product
  ``G = Aᵀ Ψ / n`` with the advantages of all λ (:func:`gae_core.estimators.gae_lambda_sweep`),
  so 101 λ cost about one.
* **Statistics over batches** (:func:`gradient_statistics`), each with a percentile-bootstrap
  interval over batches: the mean cosine of ĝ_λ to g*; the mean pairwise cosine between
  independent batches (needs no g*); variance = tr Cov(ĝ_λ) (ddof 1);
  bias² = ‖mean ĝ_λ − g*‖² − variance/K − reference_noise (both means' noise subtracted: an
  unbiased estimate, which can fall below 0); MSE = bias² + variance = E‖ĝ_λ − g*‖²; and the
  signal-to-noise ratio SNR = ‖E ĝ_λ‖² / tr Cov(ĝ_λ), with ‖E ĝ‖² estimated unbiasedly as
  ‖mean ĝ‖² − variance/K.

All of these are functions of the K × K Gram matrices of the batch gradients (and of their
differences from g*), so a bootstrap resample is a quadratic form in its counts and never
copies a gradient. Gradients are in env reward units (raw rewards, V̂ scaled back); the
parameters are the actor's (and its log-std).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
import pandas as pd
import torch
from torch import nn

from gae_core.agent.envs import episode_cap, make_eval_env, make_vector_env
from gae_core.agent.recording import Replay
from gae_core.estimators import gae_lambda_sweep, k_step_advantages
from gae_core.lab.rollouts import LabCancelled, Progress
from gae_core.lab.settings import HORIZON_TOLERANCE, MAX_HORIZON
from gae_core.lab.states import Simulator

__all__ = [
    "GradientResult",
    "GradientSettings",
    "actor_parameters",
    "batch_gradients",
    "gradient_statistics",
    "measure_gradient",
    "per_sample_scores",
]

#: The quantities measured per estimator, in the order tables and JSON give them.
QUANTITIES = ("cosine", "pairwise_cosine", "bias2", "variance", "mse", "snr")
#: Blocks of reference episodes whose spread gives the reference's own noise.
REFERENCE_BLOCKS = 32
#: Samples whose scores are held at once (a [chunk, parameters] float32 block).
SCORE_CHUNK = 8192


def _default_lambdas() -> tuple[float, ...]:
    return tuple(round(i / 100, 2) for i in range(101))


@dataclass(frozen=True)
class GradientSettings:
    """What the gradient lens measures: ``batches`` (K ≥ 2) batches of ``batch_size`` samples
    (a multiple of the run's env count; None: the run's envs × steps, the batch it trains on),
    a reference of at least ``reference`` samples (≥ the batch size), every λ of ``lambdas``
    and every k of ``ks``, discount ``gamma``; deterministic for a ``seed``."""

    gamma: float = 0.99
    lambdas: tuple[float, ...] = field(default_factory=_default_lambdas)
    ks: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    batches: int = 32
    batch_size: int | None = None
    reference: int = 500_000
    seed: int = 0
    confidence: float = 0.95
    resamples: int = 2000

    def __post_init__(self) -> None:
        if not 0.0 <= float(self.gamma) <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma}")
        if not self.lambdas or any(not 0.0 <= float(x) <= 1.0 for x in self.lambdas):
            raise ValueError(f"lambdas must be values in [0, 1], got {list(self.lambdas)}")
        if any(int(k) != k or k < 1 for k in self.ks):
            raise ValueError(f"ks must be integers ≥ 1, got {list(self.ks)}")
        if int(self.batches) != self.batches or not 2 <= self.batches <= 10_000:
            raise ValueError(f"batches must be an integer in [2, 10,000], got {self.batches}")
        if self.batch_size is not None and not 1 <= self.batch_size <= 1_000_000:
            raise ValueError(f"batch_size must be in [1, 1,000,000], got {self.batch_size}")
        if not 1 <= self.reference <= 100_000_000:
            raise ValueError(f"reference must be in [1, 100,000,000], got {self.reference}")
        if self.batch_size is not None and self.reference < self.batch_size:
            raise ValueError(
                f"reference must be at least batch_size ({self.batch_size:,}), got "
                f"{self.reference:,}"
            )
        if not 0.0 < self.confidence < 1.0:
            raise ValueError(f"confidence must be in (0, 1), got {self.confidence}")
        if self.resamples < 1:
            raise ValueError(f"resamples must be ≥ 1, got {self.resamples}")

    @property
    def horizon(self) -> int:
        """H past the time limit for the reference's returns: γ^H ≤ 10⁻³ (≤ 5,000 steps)."""
        if self.gamma < 1.0:
            steps = math.ceil(math.log(HORIZON_TOLERANCE) / math.log(self.gamma))
            return min(MAX_HORIZON, max(1, steps))
        return MAX_HORIZON

    def estimators(self) -> list[tuple[str, float]]:
        """``(kind, parameter)`` of every estimator measured: GAE per λ, then Â^(k) per k."""
        return [("gae", float(x)) for x in self.lambdas] + [("k_step", float(k)) for k in self.ks]


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


# ----------------------------------------------------------------------------- statistics


def gradient_statistics(
    gradients: np.ndarray,
    reference: np.ndarray,
    reference_noise: float = 0.0,
    *,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per estimator, ``(point, ci_low, ci_high)`` of each of :data:`QUANTITIES` (module
    docstring) from ``gradients [K, E, P]`` (K batches, E estimators), the reference g* ``[P]``
    and its noise tr Cov(ĝ*); percentile-bootstrap intervals over the K batches."""
    G = np.asarray(gradients, np.float64)
    if G.ndim != 3:
        raise ValueError(f"gradients must be [batches, estimators, parameters], got {G.shape}")
    K = G.shape[0]
    if K < 2:
        raise ValueError(f"batches must be ≥ 2 (a variance needs two), got {K}")
    g = np.asarray(reference, np.float64)
    X = np.moveaxis(G, 1, 0)  # [E, K, P]
    H = X @ X.transpose(0, 2, 1)  # Gram of the batch gradients
    diff = X - g
    D = diff @ diff.transpose(0, 2, 1)  # Gram of their differences from g*
    norms = np.sqrt(np.einsum("ekk->ek", H))
    with np.errstate(divide="ignore", invalid="ignore"):
        to_reference = (X @ g) / (norms * np.linalg.norm(g))  # [E, K]
        pairwise = H / (norms[:, :, None] * norms[:, None, :])
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(K, np.full(K, 1.0 / K), size=resamples).astype(np.float64)
    W = np.vstack([np.ones(K), counts])  # row 0: the point estimate

    def quadratic(M: np.ndarray) -> np.ndarray:  # [E, B]: cᵀ M c per resample
        return np.einsum("bk,ekl,bl->eb", W, M, W, optimize=True)

    squared_mean = quadratic(H) / K**2  # ‖ḡ‖²
    distance = quadratic(D) / K**2  # ‖ḡ − g*‖²
    variance = (np.einsum("bk,ek->eb", W, np.einsum("ekk->ek", H)) - K * squared_mean) / (K - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        values = {
            "cosine": np.einsum("bk,ek->eb", W, to_reference) / K,
            "pairwise_cosine": (quadratic(pairwise) - K) / (K * (K - 1)),
            "bias2": distance - variance / K - reference_noise,
            "variance": variance,
            "mse": distance - variance / K - reference_noise + variance,
            "snr": (squared_mean - variance / K) / variance,
        }
    alpha = (1.0 - confidence) / 2.0
    out = {}
    for name, v in values.items():
        v = np.where(np.isfinite(v), v, np.nan)
        low, high = np.nanquantile(v[:, 1:], [alpha, 1.0 - alpha], axis=1)
        out[name] = (v[:, 0], low, high)
    return out


# ----------------------------------------------------------------------------- rollouts


@dataclass
class _Windows:
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


def _windows(env_id: str, policy: Replay, batches: int, envs: int, steps: int, seed: int,
             progress: Progress) -> _Windows:  # fmt: skip
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
            progress.step(copies)
    finally:
        env.close()
    truncated |= ~valid  # a reset row is its own segment; its sample is left out

    def split(a: np.ndarray) -> np.ndarray:  # [steps, K·envs, …] → [K, steps, envs, …]
        return np.moveaxis(a.reshape(steps, batches, envs, *a.shape[2:]), 1, 0)

    return _Windows(*(split(a) for a in (rec_obs, rec_next, rec_act, rewards, terminated,
                                         truncated, valid)))  # fmt: skip


def _advantages(w: _Windows, critic: Replay, k: int, settings: GradientSettings) -> np.ndarray:
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


def _reference(env_id: str, policy: Replay, critic: Replay, settings: GradientSettings,
               progress: Progress, copies: int = 256) -> tuple[np.ndarray, float, int]:  # fmt: skip
    """(g*, tr Cov(ĝ*), samples): whole episodes from the env's start distribution, every step
    up to the time limit a sample, Monte-Carlo advantages past the limit (module docstring)."""
    rng = np.random.default_rng([settings.seed, 2])
    probe = make_eval_env(env_id)
    cap = episode_cap(probe)
    probe.close()
    horizon = cap + settings.horizon
    sim = Simulator(env_id, copies, seed=settings.seed)
    discounts = settings.gamma ** np.arange(horizon)
    total, blocks, counts = None, None, np.zeros(REFERENCE_BLOCKS)
    samples, round_ = 0, 0
    try:
        while samples < settings.reference:
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
                alive &= ~term
                progress.step(0)  # a cancel takes effect within one step
                if not alive.any():
                    break
            rows = len(rec_rew)
            rew = np.stack(rec_rew)  # [rows, copies]
            # G_t = Σ_{l ≥ t} γ^{l−t} r_l, by one reversed cumulative sum per copy
            scaled = rew * discounts[:rows, None]
            returns = np.flip(np.cumsum(np.flip(scaled, 0), 0), 0) / discounts[:rows, None]
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
                    policy.model, policy.policy_input(o[part]), _action_tensor(a[part])
                )
                scores.mul_(torch.as_tensor(advantage[part], dtype=torch.float32)[:, None])
                sums = torch.zeros((REFERENCE_BLOCKS, scores.shape[1]))
                sums.index_add_(0, torch.as_tensor(block[part]), scores)
                sums = sums.double().numpy()  # chunks add up in float64
                blocks = sums if blocks is None else blocks + sums
            counts += np.bincount(block, minlength=REFERENCE_BLOCKS)
            samples += len(o)
            progress.step(len(o))
            round_ += 1
    finally:
        sim.close()
    total = blocks.sum(0) / samples
    used = counts > 0
    means = blocks[used] / counts[used, None]
    share = counts[used] / samples
    r = int(used.sum())
    noise = float((share**2 * ((means - total) ** 2).sum(1)).sum() * r / max(r - 1, 1))
    return total, noise, samples


def _action_tensor(actions: np.ndarray) -> torch.Tensor:
    actions = np.asarray(actions)
    return torch.as_tensor(actions if actions.dtype.kind in "iu" else actions.astype(np.float32))


# ----------------------------------------------------------------------------- the result


@dataclass(frozen=True)
class GradientResult:
    """What the lens measured: ``table`` has one row per critic and estimator (``critic``,
    ``kind`` gae/k_step, ``param``, and every quantity with ``_ci_low``/``_ci_high``);
    ``reference`` its samples, noise and norm; ``meta`` the run, policy and critic steps."""

    env_id: str
    settings: GradientSettings
    table: pd.DataFrame
    reference: dict[str, float]
    batch: dict[str, int]
    seconds: float
    meta: dict[str, Any] = field(default_factory=dict)

    def best_lambda(self, critic: str | None = None) -> float:
        """The λ whose gradient has the least MSE against g* (for ``critic``, else the first)."""
        rows = self.table[self.table["kind"] == "gae"]
        rows = rows[rows["critic"] == (critic or rows["critic"].iloc[0])]
        return float(rows.loc[rows["mse"].idxmin(), "param"])

    def to_json(self) -> dict[str, Any]:
        settings = asdict(self.settings)
        settings["lambdas"], settings["ks"] = list(settings["lambdas"]), list(settings["ks"])
        return {"kind": "gradient", "env_id": self.env_id, "settings": settings,
                "table": self.table.to_dict("list"), "reference": self.reference,
                "batch": self.batch, "seconds": self.seconds, "meta": self.meta}  # fmt: skip

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GradientResult:
        settings = dict(data["settings"])
        settings["lambdas"], settings["ks"] = tuple(settings["lambdas"]), tuple(settings["ks"])
        table = pd.DataFrame(data["table"])
        return cls(data["env_id"], GradientSettings(**settings), table, data["reference"],
                   data["batch"], data["seconds"], data.get("meta", {}))  # fmt: skip


def measure_gradient(
    env_id: str,
    policy: Replay,
    critics: Sequence[Replay],
    settings: GradientSettings,
    *,
    envs: int,
    steps: int,
    critic_names: Sequence[str] | None = None,
    progress: Callable[[float], None] | None = None,
    cancel: threading.Event | None = None,
) -> GradientResult:
    """The lens for ``policy`` with each of ``critics``: K batches of ``envs × steps`` samples,
    the reference, and :func:`gradient_statistics` per critic and estimator. Raises
    :class:`~gae_core.lab.rollouts.LabCancelled` when ``cancel`` is set."""
    began = time.perf_counter()
    names = list(critic_names or [f"critic {i}" for i in range(len(critics))])
    K = settings.batches
    probe = make_eval_env(env_id)
    cap = episode_cap(probe)
    probe.close()
    # progress: the windows' env steps (at most two time limits and the window per copy), then
    # the reference's samples
    ticker = Progress(envs * K * (2 * cap + steps) + settings.reference, progress, cancel)
    windows = _windows(env_id, policy, K, envs, steps, settings.seed, ticker)
    # each batch's scores are used for every critic at once and then dropped: K batches of
    # [n, P] scores held together would be most of the memory
    gradients = np.zeros((len(critics), K, len(settings.estimators()), 0))
    for k in range(K):
        keep = windows.valid[k]
        o = policy.policy_input(windows.obs[k][keep])
        scores = per_sample_scores(policy.model, o, _action_tensor(windows.actions[k][keep]))
        each = [batch_gradients(scores, _advantages(windows, c, k, settings)) for c in critics]
        if not gradients.size:
            gradients = np.zeros((len(critics), K, *each[0].shape))
        gradients[:, k] = each
        if cancel is not None and cancel.is_set():
            raise LabCancelled("the lab was cancelled")
    g_star, noise, samples = _reference(env_id, policy, critics[0], settings, ticker)
    frames = []
    for name, G in zip(names, gradients, strict=True):
        stats = gradient_statistics(G, g_star, noise, confidence=settings.confidence,
                                    resamples=settings.resamples, seed=settings.seed)  # fmt: skip
        kinds = settings.estimators()
        frame = pd.DataFrame({"critic": name, "kind": [k for k, _ in kinds],
                              "param": [p for _, p in kinds]})  # fmt: skip
        for quantity in QUANTITIES:
            point, low, high = stats[quantity]
            frame[quantity], frame[f"{quantity}_ci_low"], frame[f"{quantity}_ci_high"] = (
                point, low, high)  # fmt: skip
        frames.append(frame)
    n = int(windows.valid.sum() / K)
    return GradientResult(
        env_id=env_id,
        settings=settings,
        table=pd.concat(frames, ignore_index=True),
        reference={
            "samples": samples,
            "noise": noise,
            "standard_error": math.sqrt(noise),
            "norm": float(np.linalg.norm(g_star)),
        },
        batch={"envs": envs, "steps": steps, "samples": n},
        seconds=time.perf_counter() - began,
    )
