"""The exact policy gradient on the random-walk chain (:mod:`gae_core.lab.chain`): the gradient
lens's anchor. With a tabular softmax policy, g* and every estimator's per-sample moments are
exact sums over states, actions and enumerated continuations, so Monte-Carlo batches of the
lens can be checked against them (``tests/test_gradient.py``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gae_core.lab.chain import ChainSpec, exact_estimator_moments, exact_values


def softmax_policy(logits: np.ndarray) -> np.ndarray:
    """π(a|s) = softmax(θ[s])_a of tabular logits θ ``[n_states, 2]``."""
    z = np.asarray(logits, float)
    z = np.exp(z - z.max(axis=1, keepdims=True))
    return z / z.sum(axis=1, keepdims=True)


def score_vectors(policy: np.ndarray) -> np.ndarray:
    """ψ ``[n, 2, 2n]``: ψ(s, a) = ∇_θ log π(a|s) of the tabular softmax, the flattened
    θ[s', b] entry being 1{s' = s}(1{b = a} − π(b|s))."""
    pi = np.asarray(policy, float)
    n = pi.shape[0]
    psi = np.zeros((n, 2, n, 2))
    for a in range(2):
        psi[np.arange(n), a, np.arange(n)] = np.eye(2)[a] - pi
    return psi.reshape(n, 2, 2 * n)


@dataclass(frozen=True)
class GradientMoments:
    """The exact policy gradient g* and the exact moments of one sample of the estimator
    ψ(s, a)·Â (s ~ ``state_weights``, a ~ π, Â from a segment of L rows): ``mean`` ``[E, P]``
    and ``second`` = E[ψψᵀ Â²] ``[E, P, P]`` for each estimator (GAE per λ, then Â^(k) per
    k). A batch of n independent samples has mean ``mean`` and covariance
    ``(second − mean meanᵀ) / n`` (:meth:`batch_covariance`)."""

    true: np.ndarray
    mean: np.ndarray
    second: np.ndarray

    def batch_covariance(self, n: int) -> np.ndarray:
        return (self.second - np.einsum("ep,eq->epq", self.mean, self.mean)) / n


def exact_gradient_moments(
    spec: ChainSpec,
    logits: np.ndarray,
    critic: np.ndarray,
    gamma: float,
    segment: int,
    lambdas: np.ndarray,
    ks: np.ndarray,
    state_weights: np.ndarray,
) -> GradientMoments:
    """The gradient lens's exact anchor: g* = Σ_s d(s) Σ_a π(a|s) ψ(s, a) (Q^π(s, a) − V̂(s))
    (the policy-gradient theorem's direction under the state distribution d, the baseline
    V̂ adding nothing in expectation) and the estimators' per-sample moments from
    :func:`exact_estimator_moments` at every non-terminal (s, a)."""
    pi = softmax_policy(logits)
    d = np.where(spec.terminal, 0.0, np.asarray(state_weights, float))
    d = d / d.sum()
    psi = score_vectors(pi)
    _, Q = exact_values(spec, pi, gamma)
    v = np.asarray(critic, float)
    true = np.einsum("s,sa,sap,sa->p", d, pi, psi, Q - v[:, None])
    lambdas, ks = np.atleast_1d(np.asarray(lambdas, float)), np.atleast_1d(np.asarray(ks, int))
    mean = np.zeros((len(lambdas) + len(ks), psi.shape[-1]))
    second = np.zeros((len(mean), psi.shape[-1], psi.shape[-1]))
    for s in np.flatnonzero(d > 0):
        for a in range(2):
            weight = d[s] * pi[s, a]
            if weight == 0.0:
                continue
            m = exact_estimator_moments(spec, pi, v, gamma, s, a, segment, lambdas, ks)
            first = np.concatenate([m.gae.mean, m.k_step.mean])
            squares = np.concatenate([m.gae.variance, m.k_step.variance]) + first**2
            outer = np.outer(psi[s, a], psi[s, a])
            mean += weight * first[:, None] * psi[s, a]
            second += weight * squares[:, None, None] * outer
    return GradientMoments(true, mean, second)
