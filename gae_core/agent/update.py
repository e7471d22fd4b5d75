"""The update: how one rollout's rows train every member of a trainer, for A2C and for PPO.

A2C takes one gradient step on all of a member's valid rows (advantages standardised over them
where the member asks). PPO (SB3's ``PPO.train``, CleanRL's ``ppo.py``) takes ``n_epochs``
passes over the rollout, each in a fresh order drawn by the member's own generator, in
minibatches of at most ``minibatch_size`` rows (below), with advantages standardised per
minibatch where the member asks; before each minibatch's step it compares the
approximate KL with ``1.5 × target_kl`` and, past it, the member takes no more steps on this
rollout (SB3's rule). Where one minibatch holds every row (CartPole's Zoo row) there is no
order to draw: each member's loss is a mean over its rows, so the order changes nothing, and
every epoch takes the rows as they are. Otherwise a member's epoch splits its V valid rows,
in its drawn order, into ⌈V / minibatch_size⌉ minibatches as even as can be (their sizes
differ by at most one); its invalid rows (NEXT_STEP reset rows, rows past its budget) are in
none. Where the minibatch size divides V (a rollout without reset rows, as the presets size
them) these are SB3's minibatches; otherwise no minibatch is a short tail of a few rows, on
which a step would be nearly one sample's (SB3 warns of such a tail; here reset rows would
make one at random).

Every gradient step is the same for both: autograd of the sum of the stepping members' losses
(:mod:`gae_core.agent.losses`; a member's parameters are its own slice of the stacks, so it
receives its own loss's gradient), or without gSDE the same gradient by hand
(``losses.a2c_gradients`` when the batch carries the networks' layer outputs, which the
trainer's rollout keeps for its actor; ``losses.ppo_gradients`` from each minibatch's passes),
each member's gradient norm clipped to its ``max_grad_norm``
(:func:`~gae_core.agent.stacked.clip_per_member`), and one optimizer step in which the members
not stepping keep their parameters and moments. A member whose loss or gradient is not finite
fails alone.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from gae_core import metrics as M
from gae_core.agent.config import TrainConfig, scheduled
from gae_core.agent.envs import discrete_actions
from gae_core.agent.losses import (
    Coefficients,
    LossTerms,
    PPOFixed,
    Rows,
    a2c_gradients,
    a2c_loss,
    ppo_fixed,
    ppo_gradients,
    ppo_loss,
    standardize,
    take_rows,
)
from gae_core.agent.optim import Optimizer
from gae_core.agent.policy import log_probs_and_entropy, sde_std
from gae_core.agent.stacked import (
    StackedMLP,
    clip_per_member,
    explained_variance,
    host,
    masked_moments,
)

__all__ = ["Batch", "Learned", "Learner", "even_minibatches", "gradient_by_hand"]


def gradient_by_hand(config: TrainConfig) -> bool:
    """Whether a trainer of ``config`` takes its loss's gradient by hand
    (``losses.a2c_gradients``, ``losses.ppo_gradients``; ``benchmarks/bench_hand_gradient.py``
    times both routes on whole runs) rather than by autograd: without gSDE (``use_sde`` on
    discrete actions is idle, :meth:`TrainConfig.idle_fields`, and changes no route)."""
    return not config.use_sde or bool(discrete_actions(config.env_id))


@dataclass
class Batch:
    """One rollout's rows per member, member-major ``[M, R, ...]`` on the trainer's device:
    observations as the policies saw them, actions, GAE advantages, the critic's targets, the
    critic's values at collection (with their graph for A2C by autograd) and the valid-row
    mask."""

    observations: torch.Tensor
    actions: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    values: torch.Tensor
    mask: torch.Tensor
    #: with A2C's gradient by hand: :meth:`StackedMLP.layers` of the actor and the critic on
    #: these rows (the rollout's own actor activations)
    actor_pass: list[torch.Tensor] | None = None
    critic_pass: list[torch.Tensor] | None = None


@dataclass
class Learned:
    """What one update did: each member's metrics, whether it took a step, and the members
    that failed with what became non-finite."""

    metrics: list[dict[str, float]]
    stepped: list[bool]
    failures: dict[int, str] = field(default_factory=dict)


class _Sums:
    """Per-member means of metrics over an update's gradient steps: each ``add`` keeps a
    member's value where ``rows`` is true (a copy: the update may change a mask it passed, as
    PPO's ``learning`` of a member that failed); :meth:`means` reads them all in one
    conversion."""

    def __init__(self, members: int) -> None:
        self.members = members
        self.entries: dict[str, list[tuple[torch.Tensor | np.ndarray, np.ndarray]]] = {}

    def add(self, key: str, value: torch.Tensor | np.ndarray, rows: np.ndarray) -> None:
        if isinstance(value, torch.Tensor) and value.requires_grad:  # (a detach is an op too)
            value = value.detach()
        self.entries.setdefault(key, []).append((value, rows.copy()))

    def means(self) -> list[dict[str, float]]:
        keys = list(self.entries)
        if not keys:
            return [{} for _ in range(self.members)]
        flat = [entry for key in keys for entry in self.entries[key]]
        tensors = [v for v, _ in flat if isinstance(v, torch.Tensor)]
        if tensors:
            if any(v.dtype != tensors[0].dtype for v in tensors):
                tensors = [v.to(torch.float64) for v in tensors]
            # one transfer for every tensor, then NumPy: an update's few dozen small sums
            # cost a µs each there against several in torch's dispatch (docs/PERFORMANCE.md)
            moved = iter(torch.stack(tensors).cpu().numpy())
        table = np.array(
            [next(moved) if isinstance(v, torch.Tensor) else v for v, _ in flat], np.float64
        )
        rows = np.array([r for _, r in flat])
        if len(flat) == len(keys):  # one entry a key (A2C's one step): nothing to sum
            totals, counts = np.where(rows, table, 0.0), rows.astype(np.float64)
        else:  # each key's entries are consecutive rows: one reduceat sums them all
            starts = list(itertools.accumulate(len(self.entries[key]) for key in keys[:-1]))
            starts = [0, *starts]
            totals = np.add.reduceat(np.where(rows, table, 0.0), starts)
            counts = np.add.reduceat(rows.astype(np.float64), starts)
        means = (totals / np.maximum(counts, 1.0)).tolist()
        seen = (counts > 0).tolist()
        return [
            {key: means[k][i] for k, key in enumerate(keys) if seen[k][i]}
            for i in range(self.members)
        ]


def even_minibatches(
    rngs: Sequence[np.random.Generator], valid: np.ndarray, size: int
) -> tuple[np.ndarray, np.ndarray]:
    """Every member's minibatches for a PPO epoch (module docstring): row indices and 0/1 slot
    weights ``[M, P, size]``, P the most any member has; member m's valid rows (``valid
    [M, R]``) in the order ``rngs[m].permutation(V)`` draws, split into ⌈V / size⌉
    minibatches as even as can be (the first starting at row 0 of that order, the j-th at
    ⌊j·V / P_m⌋); the slots left over, and the minibatches past a member's own, empty."""
    counts = valid.sum(1)
    most = int((-(-counts // size)).max(initial=0))
    index = np.zeros((len(valid), most, size), np.int64)
    weight = np.zeros((len(valid), most, size), np.float32)
    for m, (rng, count) in enumerate(zip(rngs, counts.tolist(), strict=True)):
        rows = np.flatnonzero(valid[m])[rng.permutation(count)]
        if count:
            own = -(-count // size)
            bounds = np.arange(own + 1) * count // own
            position = np.arange(count)
            part = np.searchsorted(bounds, position, side="right") - 1
            at = (m, part, position - bounds[part])
            index[at], weight[at] = rows, 1.0
    return index, weight


class Learner:
    """The update of one trainer's members (module docstring)."""

    def __init__(
        self,
        configs: Sequence[TrainConfig],
        actor: StackedMLP,
        critic: StackedMLP,
        log_std: torch.Tensor | None,
        optimizer: Optimizer,
    ) -> None:
        self.actor, self.critic, self.log_std, self.optimizer = actor, critic, log_std, optimizer
        self.discrete = log_std is None
        self.sde = configs[0].use_sde and not self.discrete
        device = actor.weights[0].device
        shared = configs[0]
        self.algo, self.epochs, self.minibatch = shared.algo, shared.n_epochs, shared.minibatch_size

        def column(values) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.float32, device=device)

        # None where no member uses one: the losses then skip the term (losses.combine, the
        # value clip); PPO's clip range is set at each update (its schedule)
        weighs_entropy = any(c.entropy_coef for c in configs)
        clips_value = any(c.clip_range_vf for c in configs)
        self.coefficients = Coefficients(
            value_coef=column([c.value_coef for c in configs]),
            entropy_coef=column([c.entropy_coef for c in configs]) if weighs_entropy else None,
            clip_range_vf=(column([c.clip_range_vf or math.inf for c in configs])
                           if clips_value else None),
        )  # fmt: skip
        self.max_norm = np.array([c.max_grad_norm or math.inf for c in configs], np.float32)
        self.standardise = torch.tensor([c.normalize_advantages for c in configs], device=device)
        self.any_standardise = bool(self.standardise.any())
        self.target_kl = np.array([c.target_kl for c in configs], np.float64)
        self.any_target_kl = bool((self.target_kl > 0).any())
        self.configs = configs
        # each member's own order of minibatches (a member draws as it would alone)
        self._orders = [np.random.default_rng([c.seed, 1]) for c in configs]

    def policy(
        self, observations: torch.Tensor, actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """log π(a|s) and the entropy per row ``[M, B]`` of every member's current policy."""
        out, features = self.actor.with_features(observations)
        log_std = None
        if self.sde:
            log_std = sde_std(features, self.log_std).log()
        elif not self.discrete:
            log_std = self.log_std[:, None, :]
        return log_probs_and_entropy(out, actions, log_std)

    def learn(
        self,
        batch: Batch,
        learning: np.ndarray | torch.Tensor,
        training: np.ndarray | torch.Tensor,
        spent: Sequence[int],
        by_hand: bool = False,
    ) -> Learned:
        """Update the members ``learning`` (bool ``[M]``, NumPy or a CPU tensor) on ``batch``;
        ``training``: the members still training (those not stepping keep their optimizer
        state); ``spent``: each member's env steps before this update (for the schedules);
        ``by_hand``: PPO's gradient by hand (:func:`gradient_by_hand`; A2C's is when the batch
        carries the passes).

        Which members step is bookkeeping on M booleans, kept in NumPy: a few dozen such ops a
        minibatch cost a µs each there against several in torch's dispatch."""
        self._spent, self._by_hand = spent, by_hand
        learning, training = (np.array(x, bool) for x in (learning, training))
        sums, failures = _Sums(len(learning)), {}
        # the rollout's own numbers, before any step, in NumPy (from an accelerator in one
        # transfer; on the CPU, views)
        columns = (batch.advantages, batch.values.detach(), batch.returns, batch.mask)
        on_host = columns[0].device.type == "cpu"
        advantages, values, returns, mask = (
            [host(c) for c in columns] if on_host else host(torch.stack(columns))
        )
        self._host_mask = mask  # (PPO's minibatches split each member's valid rows)
        raw_mean, raw_var = masked_moments(advantages, mask)
        explained = explained_variance(values, returns, mask)
        step = self._a2c if self.algo == "a2c" else self._ppo
        # by hand nothing needs a graph: inference mode spares every call autograd's dispatch
        # (docs/PERFORMANCE.md); by autograd, the losses need their graphs
        hand = by_hand if self.algo == "ppo" else batch.actor_pass is not None
        with torch.inference_mode() if hand else contextlib.nullcontext():
            stepped = step(batch, learning, training, sums, failures)
        for key, value in ((M.ADVANTAGE_MEAN.key, raw_mean),
                           (M.ADVANTAGE_STD.key, np.sqrt(raw_var)),
                           (M.EXPLAINED_VARIANCE.key, explained)):  # fmt: skip
            sums.add(key, value, stepped)
        return Learned(sums.means(), stepped.tolist(), failures)

    def _standardised(self, rows: Rows) -> Rows:
        """``rows`` with the advantages standardised over their rows for the members that ask
        (``normalize_advantages``): A2C's over the rollout, PPO's per minibatch."""
        if not self.any_standardise:
            return rows
        standardised = standardize(rows.advantages, rows.mask)
        return rows.with_advantages(
            torch.where(self.standardise[:, None], standardised, rows.advantages)
        )

    def _a2c(self, batch: Batch, learning, training, sums: _Sums, failures: dict) -> np.ndarray:
        rows = self._standardised(Rows(batch.advantages, batch.returns, batch.mask))
        if batch.actor_pass is not None:
            terms = a2c_gradients(
                self.actor, self.critic, self.log_std, batch.actor_pass, batch.critic_pass,
                batch.actions, rows, self.coefficients,
            )  # fmt: skip
            return self._gradient_step(terms, learning, training, sums, failures, by_hand=True)
        log_probs, entropy = self.policy(batch.observations, batch.actions)
        terms = a2c_loss(log_probs, entropy, batch.values, rows, self.coefficients)
        return self._gradient_step(terms, learning, training, sums, failures)

    def _ppo(self, batch: Batch, learning, training, sums: _Sums, failures: dict) -> np.ndarray:
        members, rows = batch.mask.shape
        device = batch.mask.device
        with torch.no_grad():
            old_log_probs, _ = self.policy(batch.observations, batch.actions)
        inputs = (batch.observations, batch.actions)
        rollout = Rows(batch.advantages, batch.returns, batch.mask, old_log_probs,
                       batch.values.detach())  # fmt: skip
        coefficients = replace(self.coefficients, clip_range=self._clip_ranges().to(device))
        stepped, stopped = np.zeros(members, bool), np.zeros(members, bool)
        # One minibatch holding every row (CartPole's Zoo row): each member's loss is a mean
        # over its rows, so their order changes nothing, and the rows, their standardised
        # advantages and the members with a valid row are the same at every epoch.
        whole = valid = None
        if self.minibatch >= rows:
            whole = self._minibatch(inputs, rollout, coefficients)
        else:  # (a member not learning at the start draws no order: it would draw none alone;
            # one that fails on the way keeps drawing, its minibatches skipped)
            valid = (self._host_mask > 0) & learning[:, None]
        for _ in range(self.epochs):
            if whole is None:
                index, weight = (torch.from_numpy(x).to(device) for x in
                                 even_minibatches(self._orders, valid, self.minibatch))  # fmt: skip
                parts = (
                    self._minibatch(inputs, rollout, coefficients, index[:, j], weight[:, j])
                    for j in range(index.shape[1])
                )
            else:
                parts = (whole,)
            for (observations, actions), part, fixed, counted in parts:
                now = learning & ~stopped & counted
                if not now.any():
                    continue
                if self._by_hand:
                    terms = ppo_gradients(
                        self.actor, self.critic, self.log_std, self.actor.layers(observations),
                        self.critic.layers(observations), actions, part, coefficients, fixed,
                    )  # fmt: skip
                else:
                    log_probs, entropy = self.policy(observations, actions)
                    values = self.critic(observations).squeeze(-1)
                    terms = ppo_loss(log_probs, entropy, values, part, coefficients, fixed)
                sums.add(M.APPROX_KL.key, terms.approx_kl, now)
                sums.add(M.CLIP_FRACTION.key, terms.clip_fraction, now)
                if self.any_target_kl:
                    kl = terms.approx_kl.detach().cpu().numpy().astype(np.float64)
                    over = now & (self.target_kl > 0) & (kl > 1.5 * self.target_kl)
                    stopped = stopped | over
                    now = now & ~over
                now = self._gradient_step(terms, now, training, sums, failures, self._by_hand)
                if failures:  # a member that blew up takes no more steps on this rollout
                    learning[list(failures)] = False
                stepped = stepped | now
        return stepped

    def _minibatch(
        self,
        inputs: tuple[torch.Tensor, torch.Tensor],
        rollout: Rows,
        coefficients: Coefficients,
        index: torch.Tensor | None = None,
        weight: torch.Tensor | None = None,
    ) -> tuple[tuple[torch.Tensor, torch.Tensor], Rows, PPOFixed, np.ndarray]:
        """The rows ``index [M, B]`` (None: all) of the observations and actions (``inputs``)
        and of ``rollout``, those of a slot ``weight`` 0 (an empty slot) masked out, the
        advantages standardised for the members that ask; their
        :class:`~gae_core.agent.losses.PPOFixed` under ``coefficients``; and which members
        have a valid row among them (CPU ``[M]``)."""
        if index is not None:
            inputs = tuple(take_rows(column, index) for column in inputs)
            rollout = rollout.take(index)
            if weight is not None:
                rollout = replace(rollout, mask=rollout.mask * weight)
        rows = self._standardised(rollout)
        fixed = ppo_fixed(rows, coefficients)
        return inputs, rows, fixed, rows.mask.sum(1).cpu().numpy() > 0

    def _clip_ranges(self) -> torch.Tensor:
        """Each member's PPO clip range for this update: constant, or decayed linearly with
        its share of its budget spent before the rollout (``clip_range_schedule``,
        :func:`~gae_core.agent.config.scheduled`)."""
        ranges = [scheduled(c.clip_range, c.clip_range_schedule, spent, c.total_steps)
                  for c, spent in zip(self.configs, self._spent, strict=True)]  # fmt: skip
        return torch.tensor(ranges, dtype=torch.float32)

    def _gradient_step(
        self,
        terms: LossTerms,
        now: np.ndarray,
        training: np.ndarray,
        sums: _Sums,
        failures: dict,
        by_hand: bool = False,
    ) -> np.ndarray:
        """One step of the members ``now`` on ``terms.loss``, its gradient by autograd or
        already written by hand (``by_hand``); returns those that stepped."""
        finite = np.isfinite(host(terms.loss))
        if not finite.all():
            for i in np.flatnonzero(now & ~finite).tolist():
                failures.setdefault(i, "loss")
            now = now & finite
        optimizer = self.optimizer
        if not by_hand:
            for parameters in optimizer.params:  # the trainer's buffer: zeroed in place, kept
                parameters.grad.zero_()
        if not now.any():
            return now
        if not by_hand:  # (by hand, the rows of members not stepping are zeroed just below)
            device_now = torch.from_numpy(now).to(terms.loss.device)
            with warnings.catch_warnings():
                # the trainer's gradients are views of one buffer (stacked.one_buffer)
                warnings.filterwarnings("ignore", message="grad and param do not obey")
                loss = torch.where(device_now, terms.loss, torch.zeros_like(terms.loss))
                loss.sum().backward()
        norms, finite = clip_per_member(optimizer.params, self.max_norm, now)
        if not finite.all():
            for i in np.flatnonzero(now & ~finite).tolist():
                failures.setdefault(i, "gradient")
            now = now & finite
        if now.any():
            optimizer.step(rows=now, keep=training & ~now)
        for key, value in ((M.POLICY_LOSS.key, terms.policy), (M.VALUE_LOSS.key, terms.value),
                           (M.ENTROPY.key, terms.entropy), (M.GRAD_NORM.key, norms)):  # fmt: skip
            sums.add(key, value, now)
        return now
