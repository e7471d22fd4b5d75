"""Our update against Stable-Baselines3's, the presets' reference, on the same rollout.

SB3 collects a rollout with its own policy and computes its GAE; our trainer's member 0 takes
SB3's weights, and our :class:`~gae_core.agent.update.Learner` learns from SB3's rows, in
SB3's row order, drawing SB3's minibatch permutations. One update on each side must then end
at the same weights (to float32 rounding) and report the same losses: the same objective,
minibatch epochs, advantage standardisation, value clip, KL stop, gradient-norm clip and
optimizer step (Adam for PPO, RMSprop for A2C, gSDE's variance), by autograd and by hand, and
with invalid rows among ours. Our GAE on the rows of SB3's collect, with each time limit read
as a truncation, gives SB3's advantages, and our normalisation on the same episodes gives
``VecNormalize``'s numbers. What differs is the collect's layout: SB3's envs reset in the step
that ends an episode, ours in the next (``gae_core.agent.envs``), an invalid row, so a rollout
of ours holds a few transitions fewer than its rows (how PPO splits them:
``gae_core.agent.update``).
"""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import numpy as np
import pytest
import torch
from stable_baselines3 import A2C, PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.vec_env import DummyVecEnv

from gae_core import metrics as M
from gae_core.agent.config import TrainConfig
from gae_core.agent.trainer import Trainer
from gae_core.agent.update import Batch
from gae_core.estimators import gae

ENVS, STEPS = 4, 32  # a rollout of 128 rows: CartPole's random policy ends episodes in it
#: time limits that end episodes inside a rollout, truncated (GAE's bootstrap rows) and, on
#: CartPole, terminated too
TIME_LIMIT = {"CartPole-v1": 15, "Pendulum-v1": 12}
ATOL = 2e-6  # float32 rounding of a few steps; an update moves some weight by ≥ 100 × this


class _Ends(BaseCallback):
    """Each step of SB3's collect as the env gave it, before SB3 folds a time limit's
    bootstrap into the reward: the rewards, and per env whether it was truncated and its final
    observation."""

    def __init__(self) -> None:
        super().__init__()
        self.rewards, self.truncated, self.final = [], [], []

    def _on_step(self) -> bool:
        self.rewards.append(self.locals["rewards"].copy())  # (SB3 adds γ·V(s_T) in place next)
        dones, infos = self.locals["dones"], self.locals["infos"]
        self.truncated.append([bool(d and i.get("TimeLimit.truncated")) for d, i in
                               zip(dones, infos, strict=True)])  # fmt: skip
        self.final.append([i.get("terminal_observation") for i in infos])
        return True


def _sb3(algo: str, env_id: str, ends: _Ends | None = None, **hyper):
    """An SB3 model with our networks' shape (64 × 64 tanh, separate actor and critic) and one
    rollout collected by its own loop (each step seen by ``ends``)."""
    env = DummyVecEnv([lambda: gym.make(env_id, max_episode_steps=TIME_LIMIT[env_id])] * ENVS)
    kind = PPO if algo == "ppo" else A2C
    model = kind(
        "MlpPolicy", env, n_steps=STEPS, seed=3, device="cpu",
        policy_kwargs={"net_arch": {"pi": [64, 64], "vf": [64, 64]},
                       "activation_fn": torch.nn.Tanh},
        **hyper,
    )  # fmt: skip
    _, callback = model._setup_learn(10 * ENVS * STEPS, ends)
    callback.on_training_start(locals(), globals())
    assert model.collect_rollouts(model.env, callback, model.rollout_buffer, STEPS)
    return model


def _ours(model, **fields) -> Trainer:
    """Our trainer of one member with ``model``'s weights."""
    config = TrainConfig(env_id=model.env.envs[0].spec.id, num_envs=ENVS, rollout_steps=STEPS,
                         hidden_sizes=(64, 64), gamma=model.gamma, lambda_=model.gae_lambda,
                         checkpoint_every=0, eval_every=0, record_episodes=0, **fields)  # fmt: skip
    trainer = Trainer(config)
    policy = model.policy
    pairs = (
        (trainer.actor, [*policy.mlp_extractor.policy_net, policy.action_net]),
        (trainer.critic, [*policy.mlp_extractor.value_net, policy.value_net]),
    )
    with torch.no_grad():
        for stack, modules in pairs:
            layers = [m for m in modules if isinstance(m, torch.nn.Linear)]
            for weight, bias, layer in zip(stack.weights, stack.biases, layers, strict=True):
                weight[0].copy_(layer.weight.T)
                bias[0, 0].copy_(layer.bias)
        if trainer.log_std is not None:
            trainer.log_std[0].copy_(policy.log_std)
    return trainer


def _flat(array: np.ndarray) -> np.ndarray:
    """SB3's ``swap_and_flatten``: ``[steps, envs, ...]`` → rows ``env · steps + step``."""
    return array.swapaxes(0, 1).reshape(-1, *array.shape[2:])


def _batch(model, trainer: Trainer, autograd_values: bool, invalid: int = 0) -> Batch:
    """SB3's rollout as our member 0's batch, in SB3's row order, with ``invalid`` rows of
    junk (weight 0, as NEXT_STEP reset rows are) among them at random places."""
    buffer = model.rollout_buffer
    total = ENVS * STEPS + invalid
    junk = np.zeros(total, bool)
    junk[np.random.default_rng(invalid).choice(total, invalid, replace=False)] = True

    def rows(array, dtype=torch.float32):
        valid = torch.as_tensor(_flat(array), dtype=dtype)
        out = torch.full((total, *valid.shape[1:]), 1e3).to(dtype)  # junk: huge, never used
        out[torch.from_numpy(~junk)] = valid
        return out[None]

    observations = rows(buffer.observations)
    if isinstance(model.action_space, gym.spaces.Discrete):
        actions = rows(buffer.actions[..., 0], torch.long).clamp(max=1)  # (junk: action 1)
    else:
        actions = rows(buffer.actions)
    if autograd_values:  # A2C by autograd: the critic's values with their graph
        values = trainer.critic(observations).squeeze(-1)
    else:
        values = rows(buffer.values)
    mask = torch.from_numpy(~junk).float()[None]
    return Batch(observations, actions, rows(buffer.advantages), rows(buffer.returns), values,
                 mask)  # fmt: skip


class _SameOrder:
    """Our member's minibatch order, drawn as SB3's buffer draws it (NumPy's global
    ``permutation`` after ``np.random.seed(seed)``)."""

    def __init__(self, seed: int) -> None:
        self.state = np.random.RandomState(seed)

    def permutation(self, n: int) -> np.ndarray:
        return self.state.permutation(n)


def _assert_same_networks(model, trainer: Trainer, atol: float = ATOL) -> None:
    ours = trainer.model_of(0)
    policy = model.policy
    pairs = (
        (ours.actor, [*policy.mlp_extractor.policy_net, policy.action_net]),
        (ours.critic, [*policy.mlp_extractor.value_net, policy.value_net]),
    )
    for mine, modules in pairs:
        theirs = [m for m in modules if isinstance(m, torch.nn.Linear)]
        linears = [m for m in mine if isinstance(m, torch.nn.Linear)]
        for i, (a, b) in enumerate(zip(linears, theirs, strict=True)):
            torch.testing.assert_close(a.weight, b.weight.detach(), rtol=0, atol=atol,
                                       msg=lambda m, i=i: f"layer {i} weight: {m}")  # fmt: skip
            torch.testing.assert_close(a.bias, b.bias.detach(), rtol=0, atol=atol)
    if ours.log_std is not None:
        torch.testing.assert_close(ours.log_std, policy.log_std.detach(), rtol=0, atol=atol)


def _moved(model, before: dict[str, torch.Tensor]) -> float:
    """The largest change of any parameter in SB3's update (the scale the tolerance is read
    against)."""
    after = model.policy.state_dict()
    return max(float((after[k] - before[k]).abs().max()) for k in before)


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_our_gae_on_sb3s_rows_is_sb3s(env_id):
    """SB3 folds a time limit's bootstrap γ·V(s_T) into the reward and ends the chain there;
    ours takes the env's own reward with the step marked truncated and V(s_T) as its next
    value (a termination: no next value). On the rows of SB3's collect, with truncations (and
    on CartPole terminations), both give the same advantages."""
    ends = _Ends()
    model = _sb3("ppo", env_id, ends, gamma=0.97, gae_lambda=0.9)
    buffer, policy = model.rollout_buffer, model.policy
    truncated = np.array(ends.truncated)
    ended = np.concatenate([buffer.episode_starts[1:], model._last_episode_starts[None]]) > 0
    assert truncated.sum() >= ENVS and (ended & ~truncated).any() == (env_id == "CartPole-v1")

    def value(observations) -> np.ndarray:
        with torch.no_grad():
            return policy.predict_values(policy.obs_to_tensor(observations)[0]).numpy()[..., 0]

    next_values = np.concatenate([buffer.values[1:], value(model._last_obs)[None]])
    for t, e in zip(*np.nonzero(truncated), strict=True):
        next_values[t, e] = value(ends.final[t][e][None])[0]
    ours = gae(np.array(ends.rewards), buffer.values, next_values, ended & ~truncated, truncated,
               gamma=model.gamma, lambda_=model.gae_lambda)  # fmt: skip
    np.testing.assert_allclose(ours, buffer.advantages, rtol=1e-5, atol=1e-5)


PPO_CASES = {
    # SB3's settings (theirs, ours) but smaller minibatches: 4 epochs × 4 minibatches of 32 rows
    "defaults": ({}, {}),
    "entropy, value clip": (
        {"ent_coef": 0.01, "clip_range_vf": 0.05},
        {"entropy_coef": 0.01, "clip_range_vf": 0.05},
    ),
    "raw advantages": ({"normalize_advantage": False}, {"normalize_advantages": False}),
    "one epoch": ({"n_epochs": 1}, {"n_epochs": 1}),  # SB3 logs that epoch's KL: ours too
    "a KL stop": ({}, {}),  # the target: KL_STOP
    "reset rows": ({}, {}),  # 7 invalid rows among ours: the same minibatches of valid rows
}
#: Targets whose 1.5 × falls between this rollout's approximate KLs (SB3's, measured): SB3
#: stops at the last minibatch of epoch 4 on CartPole (after 15 steps) and at the third of
#: epoch 4 on Pendulum (after 14), where a KL estimate off by a few tens of percent would not.
KL_STOP = {"CartPole-v1": 3.7e-5, "Pendulum-v1": 4.2e-4}


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
@pytest.mark.parametrize("case", list(PPO_CASES))
@pytest.mark.parametrize("by_hand", [True, False], ids=["by hand", "autograd"])
def test_a_ppo_update_is_sb3s_on_the_same_rollout(env_id, case, by_hand):
    """One PPO update (n_epochs passes in minibatches, Adam with eps 1e-5, the whole network's
    gradient norm clipped to 0.5) ends at SB3's weights, with SB3's losses and clip fraction;
    over one epoch also its approximate KL (SB3 logs its last epoch's mean, ours is the
    update's); with a KL target both stop at the same minibatch; with invalid rows among ours
    (as NEXT_STEP reset rows are) the minibatches of valid rows are still SB3's."""
    theirs, ours = PPO_CASES[case]
    if case == "a KL stop":
        theirs, ours = {"target_kl": KL_STOP[env_id]}, {"target_kl": KL_STOP[env_id]}
    hyper = {"batch_size": 32, "n_epochs": 4, "learning_rate": 1e-3, **theirs}
    model = _sb3("ppo", env_id, **hyper)
    trainer = _ours(model, **{"algo": "ppo", "minibatch_size": 32, "n_epochs": 4,
                              "learning_rate": 1e-3, "optimizer": "adam", **ours})  # fmt: skip
    try:
        invalid = 7 if case == "reset rows" else 0
        batch = _batch(model, trainer, autograd_values=False, invalid=invalid)
        trainer.learner._orders = [_SameOrder(11)]
        before = {k: v.clone() for k, v in model.policy.state_dict().items()}
        np.random.seed(11)  # noqa: NPY002 - SB3's buffer draws from NumPy's global state
        model.train()
        learned = trainer.learner.learn(batch, [True], [True], [0], by_hand=by_hand)
        logged = model.logger.name_to_value
        steps = int(next(iter(model.policy.optimizer.state.values()))["step"])
        assert _moved(model, before) > 100 * ATOL
        _assert_same_networks(model, trainer)
        assert trainer.optimizer.steps == steps  # the same number of minibatch steps
        mine = learned.metrics[0]
        if case == "a KL stop":
            # SB3's means also take the stopping minibatch's losses, ours the steps taken:
            # the weights and the step count say it
            assert 4 < steps < 16  # past the first epoch, before the last step (15 and 14)
            return
        assert steps == 4 * hyper["n_epochs"]
        compared = [
            (M.POLICY_LOSS.key, "train/policy_gradient_loss", 1.0),
            (M.VALUE_LOSS.key, "train/value_loss", 1.0),
            (M.ENTROPY.key, "train/entropy_loss", -1.0),
            (M.CLIP_FRACTION.key, "train/clip_fraction", 1.0),
            (M.EXPLAINED_VARIANCE.key, "train/explained_variance", 1.0),
        ]
        if hyper["n_epochs"] == 1:
            compared.append((M.APPROX_KL.key, "train/approx_kl", 1.0))
        for key, sb3_key, sign in compared:
            assert mine[key] == pytest.approx(sign * logged[sb3_key], rel=1e-4, abs=1e-6), key
    finally:
        trainer.close()


@pytest.mark.parametrize("algo", ["ppo", "a2c"])
def test_a_gsde_update_is_sb3s_on_the_same_rollout(algo):
    """With gSDE (Pendulum, SB3's ``use_sde``: the action's variance Σ_j φ_j(s)² σ_ja² + 1e-6
    from the actor's detached features φ) one update ends at SB3's weights and log-std
    matrix, by autograd (gSDE's route)."""
    hyper = {"ppo": {"batch_size": 32, "n_epochs": 4, "learning_rate": 1e-3},
             "a2c": {"learning_rate": 7e-4}}[algo]  # fmt: skip
    model = _sb3(algo, "Pendulum-v1", use_sde=True, ent_coef=0.01, **hyper)
    fields = {"ppo": {"minibatch_size": 32, "n_epochs": 4, "optimizer": "adam",
                      "learning_rate": 1e-3},
              "a2c": {"optimizer": "rmsprop", "learning_rate": 7e-4,
                      "normalize_advantages": False}}[algo]  # fmt: skip
    trainer = _ours(model, algo=algo, use_sde=True, entropy_coef=0.01, **fields)
    try:
        assert not trainer.by_hand and trainer.log_std.shape == (1, 64, 1)
        batch = _batch(model, trainer, autograd_values=algo == "a2c")
        trainer.learner._orders = [_SameOrder(5)]
        before = {k: v.clone() for k, v in model.policy.state_dict().items()}
        np.random.seed(5)  # noqa: NPY002 - SB3's buffer draws from NumPy's global state
        model.train()
        learned = trainer.learner.learn(batch, [True], [True], [0])
        assert _moved(model, before) > 100 * ATOL
        _assert_same_networks(model, trainer)
        entropy = model.logger.name_to_value["train/entropy_loss"]
        assert learned.metrics[0][M.ENTROPY.key] == pytest.approx(-entropy, rel=1e-4, abs=1e-6)
    finally:
        trainer.close()


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
@pytest.mark.parametrize("by_hand", [True, False], ids=["by hand", "autograd"])
@pytest.mark.parametrize(("entropy_coef", "invalid"), [(0.0, 0), (0.01, 0), (0.01, 7)])
def test_an_a2c_update_is_sb3s_on_the_same_rollout(env_id, by_hand, entropy_coef, invalid):
    """One A2C step (RMSprop α = 0.99, eps 1e-5, the gradient norm clipped to 0.5) ends at
    SB3's weights with SB3's losses, by hand (the rollout's activations kept) and by
    autograd, with or without invalid rows among ours (weight 0)."""
    model = _sb3("a2c", env_id, ent_coef=entropy_coef, learning_rate=7e-4)
    trainer = _ours(model, algo="a2c", optimizer="rmsprop", learning_rate=7e-4,
                    entropy_coef=entropy_coef, normalize_advantages=False)  # fmt: skip
    try:
        batch = _batch(model, trainer, autograd_values=not by_hand, invalid=invalid)
        if by_hand:
            batch = dataclasses.replace(
                batch,
                actor_pass=trainer.actor.layers(batch.observations),
                critic_pass=trainer.critic.layers(batch.observations),
            )
        before = {k: v.clone() for k, v in model.policy.state_dict().items()}
        model.train()
        learned = trainer.learner.learn(batch, [True], [True], [0])
        assert _moved(model, before) > 100 * ATOL
        _assert_same_networks(model, trainer)
        logged, mine = model.logger.name_to_value, learned.metrics[0]
        for key, sb3_key, sign in (
            (M.POLICY_LOSS.key, "train/policy_loss", 1.0),
            (M.VALUE_LOSS.key, "train/value_loss", 1.0),
            (M.ENTROPY.key, "train/entropy_loss", -1.0),
        ):
            assert mine[key] == pytest.approx(sign * logged[sb3_key], rel=1e-4, abs=1e-6), key
    finally:
        trainer.close()


class _Scripted(gym.Env):
    """Episodes scripted by env index (its first reset's seed), episode and step, actions
    ignored: the same lengths in every env (so both vector envs count their samples in the
    same batches), terminations and truncations in turn, and an outlier observation and
    reward that the ±10 clips cut."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)
    LENGTHS = (4, 7, 5, 9, 6)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self.index, self.episode = seed, 0
        else:
            self.episode += 1
        self.t = 0
        return self._observation(), {}

    def _observation(self) -> np.ndarray:
        i, e, t = self.index, self.episode, self.t
        x = [np.sin(1.3 * t + i) * (1 + e), np.cos(0.7 * t * i) + 5.0, (t * i) % 3]
        if (i, e, t) == (0, 6, 1):  # past 100 samples: far beyond 10 of their stds
            x[0] = 1e3
        return np.array(x, np.float32)

    def step(self, action):
        self.t += 1
        end = self.t >= self.LENGTHS[self.episode % len(self.LENGTHS)]
        outlier = (self.index, self.episode, self.t) == (0, 7, 2)
        reward = float(np.cos(self.t + self.index)) + (1e3 if outlier else 0.0)
        terminated = end and self.episode % 2 == 0
        return self._observation(), reward, terminated, end and not terminated, {}


gym.register("ParityScripted-v0", entry_point=_Scripted)


def test_our_normalisation_is_vecnormalizes_on_the_same_episodes():
    """Fed the same episodes, our trainer's observation and reward normalisation gives what
    SB3's ``VecNormalize`` (the presets' reference) gives: every normalised observation a
    policy acts on, every normalised reward of a transition, and the statistics at the end.
    Our envs reset in the step after an episode's end (an invalid row, whose final
    observation is not counted); SB3's in the same step."""
    from stable_baselines3.common.vec_env import VecNormalize

    sb3 = VecNormalize(DummyVecEnv([lambda: _Scripted()] * ENVS), gamma=0.99)
    sb3.seed(0)
    acted, rewards = [sb3.reset()], []
    config = TrainConfig(env_id="ParityScripted-v0", num_envs=ENVS, rollout_steps=STEPS,
                         gamma=0.99, normalize_observations=True, normalize_rewards=True,
                         checkpoint_every=0, eval_every=0, record_episodes=0)  # fmt: skip
    trainer = Trainer(config)
    try:
        ours_acted, ours_rewards = [], []
        for _ in range(3):
            trainer.collect([0])
            rollout = trainer._batch
            valid = rollout.valid.all(1)
            assert (rollout.valid.any(1) == valid).all()  # every env resets in the same step
            ours_acted.append(rollout.observations[:-1][valid])
            ours_rewards.append(rollout.rewards[valid])
        ours_acted, ours_rewards = np.concatenate(ours_acted), np.concatenate(ours_rewards)
        transitions = len(ours_rewards)
        assert transitions < 3 * STEPS  # reset rows were skipped
        for _ in range(transitions):
            observations, reward, _, _ = sb3.step(np.zeros(ENVS, np.int64))
            acted.append(observations)
            rewards.append(reward)
        acted, rewards = np.stack(acted[:transitions]), np.stack(rewards)
        assert np.abs(acted).max() == pytest.approx(10.0)  # the outliers were clipped
        assert np.abs(rewards).max() == pytest.approx(10.0)
        np.testing.assert_allclose(ours_acted, acted, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(ours_rewards, rewards, rtol=1e-5, atol=1e-5)
        # (SB3 takes a batch's moments in float32, the observations' dtype; ours in float64)
        state = trainer.normalizers.state(0)
        np.testing.assert_allclose(state["obs_mean"], sb3.obs_rms.mean, rtol=1e-6)
        np.testing.assert_allclose(state["obs_var"], sb3.obs_rms.var, rtol=1e-6)
        assert float(state["obs_count"]) == pytest.approx(sb3.obs_rms.count, rel=1e-12)
        assert float(state["return_var"]) == pytest.approx(float(sb3.ret_rms.var), rel=1e-6)
    finally:
        trainer.close()
