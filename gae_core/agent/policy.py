"""Actor-critic networks: a categorical or diagonal-Gaussian policy and a state-value critic.

Actor and critic are separate tanh MLPs (no shared trunk), as in the paper's experiments and
SB3's A2C default, so a rollout step runs only the actor. Sampling happens in numpy with the
trainer's own ``np.random.Generator``: it is cheaper than ``torch.distributions`` for a batch of
16 rows and does not touch torch's process-global RNG, which other runs' threads share.
"""

from __future__ import annotations

import itertools
import math

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["SDE_EPSILON", "ActorCritic", "log_probs_and_entropy", "sample_actions", "sde_std"]

_LOG_2PI = math.log(2.0 * math.pi)
#: Added to gSDE's per-step variance (SB3's ``epsilon``): a zero feature vector is not a
#: zero-width Gaussian.
SDE_EPSILON = 1e-6


def _mlp(sizes: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (fan_in, fan_out) in enumerate(itertools.pairwise(sizes)):
        layers.append(nn.Linear(fan_in, fan_out))
        if i < len(sizes) - 2:
            layers.append(nn.Tanh())
    return nn.Sequential(*layers)


def _init(
    net: nn.Sequential, output_gain: float, generator: torch.Generator, orthogonal: bool = True
) -> None:
    """Orthogonal init (gain √2 hidden, ``output_gain`` last), zero biases: the CleanRL/SB3
    recipe; a small policy gain starts the policy near uniform. ``orthogonal=False``:
    PyTorch's own ``nn.Linear`` init (weights and biases ~ U(±1/√fan_in)), as SB3 with
    ``ortho_init=False``, drawn from ``generator`` (never the global RNG)."""
    linears = [m for m in net if isinstance(m, nn.Linear)]
    for i, layer in enumerate(linears):
        if not orthogonal:
            bound = 1.0 / math.sqrt(layer.in_features)
            nn.init.uniform_(layer.weight, -bound, bound, generator=generator)
            nn.init.uniform_(layer.bias, -bound, bound, generator=generator)
            continue
        gain = output_gain if i == len(linears) - 1 else math.sqrt(2.0)
        nn.init.orthogonal_(layer.weight, gain=gain, generator=generator)
        nn.init.zeros_(layer.bias)


def sample_actions(out: np.ndarray, rng: np.random.Generator, std: np.ndarray | None):
    """Actions for the actor's outputs ``out [B, A]``: a categorical sample of the logits
    (``std`` None) or the Gaussian ``out + std · N(0, 1)`` (float32); one draw of ``rng`` of
    ``out``'s shape either way."""
    if std is None:
        # Gumbel-max: argmax(logits + Gumbel noise) is an exact categorical sample.
        return (out + rng.gumbel(size=out.shape)).argmax(axis=1)
    return (out + std * rng.standard_normal(out.shape)).astype(np.float32)


def log_probs_and_entropy(
    out: torch.Tensor,
    actions: torch.Tensor,
    log_std: torch.Tensor | None,
    keep: list[torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """log π(a|s) and the policy's entropy per row from the actor's outputs ``out [..., A]``:
    logits (``log_std`` None), or Gaussian means with ``log_std`` broadcastable to ``out`` (one
    per action dimension, per member ``[M, 1, A]``, or per row with gSDE). The one owner of
    both formulas: a single network, a population and the lab all call it.

    Categorical: log p_a = log_softmax(z)_a, H = −Σ_a p_a log p_a. Diagonal Gaussian:
    log π = Σ_i [−½ ((a_i − μ_i)/σ_i)² − log σ_i − ½ log 2π], H = Σ_i [½ + ½ log 2π + log σ_i].
    With logits, ``keep`` (a list) receives log p and p of every action, which a gradient by
    hand takes instead of computing them again.
    """
    if log_std is None:
        log_p = F.log_softmax(out, dim=-1)
        p = log_p.exp()
        if keep is not None:
            keep += [log_p, p]
        log_probs = log_p.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
        return log_probs, -(p * log_p).sum(-1)
    log_std = log_std.expand(out.shape)
    z = (actions - out) * torch.exp(-log_std)
    log_probs = (-0.5 * z.square() - log_std - 0.5 * _LOG_2PI).sum(-1)
    entropy = (0.5 + 0.5 * _LOG_2PI + log_std).sum(-1)
    return log_probs, entropy


def sde_std(features: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    """The per-step std of gSDE's action noise, ``√(φ² · σ² + ε)``: features ``[..., B, F]``
    and log-std ``[..., F, A]`` (one network's, or a population's stacked) → ``[..., B, A]``."""
    variance = features.square() @ (2.0 * log_std).exp()
    return (variance + SDE_EPSILON).sqrt()


def _forward(layers: list[nn.Linear], x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """An MLP's output (tanh between ``layers``) and its last layer's input. ``F.linear`` on
    the layers directly: at a rollout's few dozen rows ``nn.Module.__call__``'s overhead is
    most of the time (measured: a critic pass through the ``nn.Sequential`` cost 0.2 ms)."""
    h = features = x
    last = len(layers) - 1
    for i, layer in enumerate(layers):
        if i == last:
            features = h
        h = F.linear(h, layer.weight, layer.bias)
        if i < last:
            h = torch.tanh(h)
    return h, features


class ActorCritic(nn.Module):
    """π(a|s) and V(s) for a flat Box observation space and a Discrete or 1-D Box action space.

    Continuous actions: a Gaussian with a state-independent log-std parameter, or with ``sde``
    generalized state-dependent exploration (gSDE, Raffin, Kober & Stulp 2022; SB3's
    ``use_sde`` with ``full_std``): the noise is ``φ(s) · W``, with φ(s) the actor's last hidden
    features (detached) and W a ``[features, actions]`` matrix with entries ~ N(0, σ²),
    ``σ = exp(log_std)`` (one log-std per entry). The trainer draws one W per env per rollout
    (``Trainer._sde_noise``), so exploration is smooth along a trajectory. For a given s the
    action is Gaussian with mean μ(s) and variance ``Σ_j φ_j(s)² σ_ja² + ε`` per dimension
    (ε = 1e-6, as SB3), which is what the log-prob and entropy use; without a W (replays, the
    lab) ``sample`` draws from that same per-step distribution. ``sample`` returns the
    *unclipped* sample, whose log-prob the loss uses; the trainer clips a copy to the action
    bounds for the env (the usual practice, e.g. SB3; the paper does not discuss bounds).
    """

    def __init__(
        self,
        observation_space: gym.spaces.Box,
        action_space: gym.Space,
        hidden_sizes: tuple[int, ...],
        seed: int,
        log_std_init: float = 0.0,
        sde: bool = False,
        ortho_init: bool = True,
    ) -> None:
        super().__init__()
        obs_dim = int(observation_space.shape[0])
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        out_dim = int(action_space.n) if self.discrete else int(action_space.shape[0])
        self.sde = sde and not self.discrete
        self.actor = _mlp([obs_dim, *hidden_sizes, out_dim])
        self.critic = _mlp([obs_dim, *hidden_sizes, 1])
        features = hidden_sizes[-1] if hidden_sizes else obs_dim  # the last layer's input
        shape = (features, out_dim) if self.sde else (out_dim,)
        self.log_std = (
            None if self.discrete else nn.Parameter(torch.full(shape, float(log_std_init)))
        )
        generator = torch.Generator().manual_seed(seed)  # local: no global RNG state touched
        _init(self.actor, 0.01, generator, ortho_init)
        _init(self.critic, 1.0, generator, ortho_init)
        self._actor_layers = [m for m in self.actor if isinstance(m, nn.Linear)]
        self._critic_layers = [m for m in self.critic if isinstance(m, nn.Linear)]

    def _actor_forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self._actor_features(obs)[0]

    def _actor_features(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The actor's output and its last hidden features φ(s) (the input, with no hidden
        layer), detached: gSDE's noise does not train the features (SB3's default)."""
        h, features = _forward(self._actor_layers, obs)
        return h, features.detach()

    def _sde_std(self, features: torch.Tensor) -> torch.Tensor:
        return sde_std(features, self.log_std)

    def values(self, obs: torch.Tensor) -> torch.Tensor:
        """V(s) for ``obs [..., obs_dim]`` → ``[...]``."""
        return _forward(self._critic_layers, obs)[0].squeeze(-1)

    def sample(self, obs: torch.Tensor, rng: np.random.Generator) -> np.ndarray:
        """Sample actions for a batch (call under ``torch.inference_mode``); numpy out:
        int64 ``[B]`` (discrete) or float32 ``[B, action_dim]`` (continuous, unclipped). With
        gSDE each row's noise is drawn afresh from the per-step distribution (no W held: a
        replay's, the lab's)."""
        if self.sde:
            out, features = self._actor_features(obs)
            std = self._sde_std(features).cpu().numpy()
            out = out.cpu().numpy()
            return (out + std * rng.standard_normal(out.shape)).astype(np.float32)
        out = self._actor_forward(obs).cpu().numpy()
        std = None if self.discrete else np.exp(self.log_std.detach().cpu().numpy())
        return sample_actions(out, rng, std)

    def act(self, obs: torch.Tensor) -> np.ndarray:
        """The deterministic action for a batch (call under ``torch.inference_mode``): the most
        likely one (argmax of the logits) or the Gaussian's mean; numpy out, unclipped."""
        out = self._actor_forward(obs).cpu().numpy()
        return out.argmax(axis=1) if self.discrete else out.astype(np.float32)

    def log_probs_and_entropy(
        self, obs: torch.Tensor, actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """log π(a|s) and the policy entropy per row, differentiable. ``obs [B, obs_dim]``."""
        out, features = self._actor_features(obs)
        if self.discrete:
            return log_probs_and_entropy(out, actions, None)
        # gSDE: a per-row std, √(φ(s)² · σ² + ε); otherwise one std for every row
        log_std = self._sde_std(features).log() if self.sde else self.log_std
        return log_probs_and_entropy(out, actions, log_std)
