"""A single run's forward and backward passes on the CPU in NumPy, on one flat parameter buffer.

Why not torch autograd here: at a preset's few dozen rows an update is about a hundred tiny
ops, and eager torch spends several µs of dispatch on each (more inside autograd) where NumPy
spends about one. ``python benchmarks/bench_train.py`` measures both engines side by side on
the CartPole preset (its table is in the README). Clipping follows ``clip_grad_norm_``'s rule
in three NumPy calls (:meth:`NumpyA2C.clip`); the optimizer step stays
:class:`~gae_core.agent.optim.Optimizer`'s, run once on the flat buffer. The torch
:class:`~gae_core.agent.policy.ActorCritic` keeps owning the weights: its parameters become
views of the flat buffer, so checkpoints, replays and evaluations read the very weights this
engine trains. ``tests/test_numpy_a2c.py`` checks every gradient below against torch autograd,
and whole training updates against the torch engine.

The loss is the trainer's, over the B valid rows of a rollout (A advantages, R the critic's
targets, c_v ``value_coef``, c_e ``entropy_coef``)::

    loss = −mean_b A_b log π(a_b|s_b) + c_v mean_b (R_b − V(s_b))² − c_e mean_b H(π(·|s_b))

and its gradients, with respect to the networks' outputs:

- categorical logits z_b (p_b = softmax(z_b), H_b its entropy, e_a the one-hot of a)::

      ∂loss/∂z_b = [A_b (p_b − e_{a_b}) + c_e p_b ⊙ (log p_b + H_b)] / B

- Gaussian means μ_b and the log-std ℓ (one per action dimension), u_b = (a_b − μ_b) e^{−ℓ}::

      ∂loss/∂μ_b = −A_b u_b e^{−ℓ} / B,     ∂loss/∂ℓ = −mean_b A_b (u_b² − 1) − c_e

- the critic's values: ∂loss/∂V_b = −2 c_v (R_b − V_b) / B;

and through each layer y = x Wᵀ + b and each h = tanh(y): ∂W = ∂yᵀ x, ∂b = Σ_rows ∂y,
∂x = ∂y W, ∂y = ∂h ⊙ (1 − h²).

gSDE (a state-dependent std) and non-CPU devices stay on the torch engine (:func:`supports`).
Pickling the model (not done by this project; ``torch.save`` and ``deepcopy`` are fine) would
write the whole flat buffer once per parameter.
"""

from __future__ import annotations

import numpy as np
import torch
from threadpoolctl import threadpool_limits

from gae_core.agent.policy import ActorCritic, sample_actions

__all__ = ["NumpyA2C", "supports"]

_blas_threads: list[int] = []  # the BLAS thread limit this process last set


def _limit_blas(threads: int) -> None:
    """Limit NumPy's BLAS to ``threads`` (process-wide, like ``torch.set_num_threads``); only
    when that changes, so runs built in several threads do not reset it under each other."""
    if _blas_threads != [threads]:
        threadpool_limits(limits=threads, user_api="blas")
        _blas_threads[:] = [threads]


def supports(use_sde: bool, device: str) -> bool:
    """Whether a run with these settings trains on the NumPy engine (else on torch autograd)."""
    return not use_sde and device == "cpu"


class _Net:
    """One MLP's layers as NumPy views of the flat weights and of the flat gradient."""

    def __init__(self, layers: list[torch.nn.Linear], grads: dict[int, np.ndarray]) -> None:
        self.weights = [(layer.weight.detach().numpy(), layer.bias.detach().numpy())
                        for layer in layers]  # fmt: skip
        self.grads = [(grads[id(layer.weight)], grads[id(layer.bias)]) for layer in layers]

    def forward(self, x: np.ndarray) -> list[np.ndarray]:
        """Every layer's input and the output: ``[x, h_1, …, out]`` (tanh between layers)."""
        outputs = [x]
        last = len(self.weights) - 1
        for i, (weight, bias) in enumerate(self.weights):
            x = x @ weight.T
            x += bias
            if i < last:
                np.tanh(x, out=x)
            outputs.append(x)
        return outputs

    def backward(self, outputs: list[np.ndarray], grad: np.ndarray) -> None:
        """Write ∂loss/∂(W, b) of every layer into the flat gradient, from ``grad`` = ∂loss/∂out
        and :meth:`forward`'s ``outputs``."""
        for i in range(len(self.weights) - 1, -1, -1):
            grad_weight, grad_bias = self.grads[i]
            np.matmul(grad.T, outputs[i], out=grad_weight)
            np.sum(grad, axis=0, out=grad_bias)
            if i > 0:
                hidden = outputs[i]
                grad = grad @ self.weights[i][0]
                grad *= 1.0 - hidden * hidden


class NumpyA2C:
    """The actor's sampling pass, the critic's pass and the loss gradient of one run, in NumPy.

    Construction moves ``model``'s parameters into one flat float32 buffer (:attr:`flat`, a
    torch tensor whose ``grad`` is the flat gradient after :meth:`gradients`) and limits BLAS to
    ``threads`` threads (process-wide, as ``torch.set_num_threads``).
    """

    def __init__(self, model: ActorCritic, threads: int) -> None:
        _limit_blas(threads)
        params = list(model.parameters())
        self.flat = torch.cat([p.detach().reshape(-1) for p in params])
        self._grad = torch.zeros_like(self.flat)
        self.flat.grad = self._grad
        grad = self._grad.numpy()
        grads, offset = {}, 0
        for p in params:
            size = p.numel()
            p.data = self.flat[offset : offset + size].view_as(p)
            grads[id(p)] = grad[offset : offset + size].reshape(p.shape)
            offset += size
        self.discrete = model.discrete
        self.actor = _Net(model._actor_layers, grads)
        self.critic = _Net(model._critic_layers, grads)
        self.log_std = None if model.discrete else model.log_std.detach().numpy()
        self.grad_log_std = None if model.discrete else grads[id(model.log_std)]
        self._critic_pass: list[np.ndarray] = []

    def clip(self, max_norm: float) -> float:
        """Scale the flat gradient to global norm ≤ ``max_norm`` (``inf``: leave it) and return
        the norm before, by ``torch.nn.utils.clip_grad_norm_``'s rule (scale by
        max_norm / (norm + 1e-6) where that is below 1). Hand-written: on one flat tensor that
        function's bookkeeping cost about 140 µs per update, some 8 % of a CartPole update on
        this engine (py-spy), against a few µs for these three NumPy calls."""
        grad = self.flat.grad.numpy()
        norm = float(np.sqrt(np.dot(grad, grad)))
        scale = max_norm / (norm + 1e-6)
        if scale < 1.0:
            grad *= np.float32(scale)
        return norm

    def sample(self, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Actions for ``obs [B, obs_dim]``, as :meth:`ActorCritic.sample` draws them."""
        out = self.actor.forward(obs)[-1]
        std = None if self.discrete else np.exp(self.log_std)
        return sample_actions(out, rng, std)

    def values(self, observations: np.ndarray) -> np.ndarray:
        """V(s) for ``observations [..., obs_dim]`` → ``[...]``; the pass is kept for the value
        loss's gradient in :meth:`gradients`."""
        rows = observations.reshape(-1, observations.shape[-1])
        self._critic_pass = self.critic.forward(rows)
        return self._critic_pass[-1].reshape(observations.shape[:-1])

    def gradients(
        self,
        observations: np.ndarray,
        actions: np.ndarray,
        advantages: np.ndarray,
        returns: np.ndarray,
        rows: np.ndarray,
        value_coef: float,
        entropy_coef: float,
    ) -> tuple[dict[str, float], np.ndarray]:
        """Write the loss's gradient into ``flat.grad``; return the loss and its terms, and the
        critic's values of the valid rows.

        ``observations``, ``actions``, ``advantages``, ``returns``: the B valid rows.
        ``rows``: those rows' indices into the last :meth:`values` pass, whose values V are the
        critic's part of the loss.
        """
        if not self._critic_pass:
            raise RuntimeError("gradients() needs a values() pass over this rollout first")
        self.flat.grad = self._grad  # the buffer the views below write, whatever reset .grad
        count = len(advantages)
        values = self._critic_pass[-1][rows, 0]
        errors = returns - values
        grad_values = np.zeros_like(self._critic_pass[-1])
        grad_values[rows, 0] = (-2.0 * value_coef / count) * errors
        self.critic.backward(self._critic_pass, grad_values)
        self._critic_pass = []  # one update per pass, as autograd frees its graph

        actor_pass = self.actor.forward(observations)
        out = actor_pass[-1]
        if self.discrete:
            shifted = out - out.max(axis=1, keepdims=True)
            log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
            p = np.exp(log_p)
            taken = np.arange(count)
            log_probs = log_p[taken, actions]
            entropy = -(p * log_p).sum(axis=1)
            grad_out = p * (entropy_coef * (log_p + entropy[:, None]))
            weighted = p * advantages[:, None]
            weighted[taken, actions] -= advantages
            grad_out += weighted
            grad_out /= count
        else:
            inv_std = np.exp(-self.log_std)
            u = (actions - out) * inv_std
            log_probs = (-0.5 * u * u - self.log_std - 0.5 * np.log(2.0 * np.pi)).sum(axis=1)
            entropy = np.full(count, (0.5 + 0.5 * np.log(2.0 * np.pi) + self.log_std).sum())
            grad_out = u * inv_std * (-advantages / count)[:, None]
            scaled = advantages[:, None] * (u * u - 1.0)
            self.grad_log_std[:] = -scaled.mean(axis=0) - entropy_coef
        self.actor.backward(actor_pass, grad_out.astype(np.float32, copy=False))

        policy = float(-(advantages * log_probs).mean())
        value = float((errors * errors).mean())
        entropy_mean = float(entropy.mean())
        return {
            "loss": policy + value_coef * value - entropy_coef * entropy_mean,
            "policy": policy,
            "value": value,
            "entropy": entropy_mean,
        }, values
