"""Replaying a policy: checkpoints, recorded episodes, deterministic evaluation, and values from
any checkpoint's critic.

A checkpoint holds the actor-critic's weights and the normalisation statistics of the moment
(observation mean and variance, the return variance that scales rewards). A :class:`Replay` is a
checkpoint made usable with those statistics *frozen*: it takes the env's raw observations,
normalises them as the policy saw them in training (``(obs − mean) / √(var + ε)``, gymnasium's
``NormalizeObservation`` formula, frozen), and reports values in the env's reward units: the
critic learned returns of rewards divided by σ = √(return_var + ε), so its output times σ is in
the env's units (:attr:`Replay.value_scale`; 1 without reward normalisation). Recorded
trajectories therefore keep raw observations and raw rewards, and every checkpoint can re-value
them with its own statistics.
"""

from __future__ import annotations

import functools
import io
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np
import torch

from gae_core.agent.config import TrainConfig
from gae_core.agent.envs import clip_normalized, episode_cap, make_eval_env, make_vector_env
from gae_core.agent.normalize import NORMALIZATION_EPSILON
from gae_core.agent.policy import ActorCritic
from gae_core.trajectory import Trajectory

__all__ = [
    "NORMALIZATION_EPSILON",
    "Replay",
    "checkpoint_bytes",
    "evaluate_policies",
    "evaluate_replay",
    "evaluate_values",
    "load_replay",
    "record_episode",
    "record_replay",
    "record_replays",
    "record_together",
]


@dataclass
class Replay:
    """A policy and critic with frozen normalisation, on raw observations (module docstring)."""

    model: ActorCritic
    obs_mean: np.ndarray | None = None
    obs_var: np.ndarray | None = None
    return_var: float | None = None
    clip: float = 0.0  # normalised observations clipped to ±clip when > 0 (normalize_clip)
    device: torch.device = torch.device("cpu")  # noqa: RUF009 - an immutable default

    @property
    def value_scale(self) -> float:
        """σ of the reward normalisation: critic output × this = value in env reward units."""
        if self.return_var is None:
            return 1.0
        return float(np.sqrt(self.return_var + NORMALIZATION_EPSILON))

    def policy_input(self, observations: np.ndarray) -> torch.Tensor:
        """Raw observations ``[B, obs_dim]`` as the network sees them (float32 tensor)."""
        observations = np.asarray(observations, np.float64)
        if self.obs_mean is not None:
            observations = (observations - self.obs_mean) / np.sqrt(
                self.obs_var + NORMALIZATION_EPSILON
            )
            if self.clip > 0:
                observations = clip_normalized(observations, self.clip)
        return torch.as_tensor(observations.astype(np.float32), device=self.device)

    def values(self, observations: np.ndarray) -> np.ndarray:
        """V(s) in env reward units for raw observations ``[B, obs_dim]``; float32 ``[B]``."""
        with torch.inference_mode():
            out = self.model.values(self.policy_input(observations)).cpu().numpy()
        return (out * self.value_scale).astype(np.float32)

    def sample(self, observations: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        with torch.inference_mode():
            return self.model.sample(self.policy_input(observations), rng)

    def act(self, observations: np.ndarray) -> np.ndarray:
        """Deterministic actions (argmax / mean) for raw observations."""
        with torch.inference_mode():
            return self.model.act(self.policy_input(observations))


def checkpoint_bytes(model: ActorCritic, normalization: dict[str, np.ndarray]) -> bytes:
    """``torch.save`` of ``{"model": state_dict, **normalization}``, CPU tensors only (so
    ``torch.load(weights_only=True)`` reads it)."""
    state = {
        "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        **{k: torch.as_tensor(v) for k, v in normalization.items()},
    }
    out = io.BytesIO()
    torch.save(state, out)
    return out.getvalue()


def load_replay(
    config: TrainConfig, blob: bytes, *, run_id: str | None = None, step: int | None = None
) -> Replay:
    """The checkpoint ``blob`` of a run with ``config``, on the CPU, in eval mode. Reads both the
    current format and the plain state dicts of earlier versions (no normalisation).

    A blob that is not such a checkpoint (garbage, truncated, or another network's weights) is a
    ``StoreError`` in one line naming the run and step when given: nothing from it is ever run
    (``weights_only``), so there is nothing to retry."""
    from gae_core.errors import StoreError

    env = make_eval_env(config.env_id)
    try:
        model = ActorCritic(
            env.observation_space,
            env.action_space,
            config.hidden_sizes,
            0,
            config.log_std_init,
            config.use_sde,
        )
    finally:
        env.close()
    what = "the checkpoint" if run_id is None else f"run {run_id}'s checkpoint"
    if step is not None:
        what += f" at env step {step:,}"
    try:
        with warnings.catch_warnings():  # torch warns about foreign pickle protocols
            warnings.simplefilter("ignore")
            state = torch.load(io.BytesIO(blob), weights_only=True, map_location="cpu")
        if not isinstance(state, dict):
            raise TypeError(f"it holds a {type(state).__name__}, not a dict of weights")
    except Exception as exc:  # torch's messages span lines and advise weights_only=False
        reason = f"it is not a saved checkpoint ({type(exc).__name__})"
        if not blob or isinstance(exc, TypeError):
            reason = str(exc) if blob else "it is empty"
        raise StoreError(
            f"{what} cannot be read: {reason}; the store holds damaged or foreign data there"
        ) from None
    extra = {}
    try:
        if "model" in state:
            extra = {k: v.numpy() for k, v in state.items() if k != "model"}
            state = state["model"]
        model.load_state_dict(state)
    except Exception as exc:
        detail = " ".join(str(exc).split())  # torch lists each key on a line of its own
        detail = detail if len(detail) <= 200 else detail[:199] + "…"
        raise StoreError(
            f"{what} cannot be read: its weights do not fit the run's network "
            f"({config.env_id}, hidden sizes {list(config.hidden_sizes)}): "
            f"{detail or type(exc).__name__}"
        ) from None
    return Replay(
        model.eval(),
        obs_mean=extra.get("obs_mean"),
        obs_var=extra.get("obs_var"),
        return_var=float(extra["return_var"]) if "return_var" in extra else None,
        clip=config.normalize_clip,
    )


def record_episode(env: gym.Env, replay: Replay, rng: np.random.Generator, seed: int) -> Trajectory:
    """One episode of the replay's policy (actions sampled with ``rng``) on ``env`` reset with
    ``seed``, capped at the spec's time limit (marked truncated); values in one batch, in env
    reward units."""
    sample = lambda obs, _: [replay.sample(obs[0][None], rng)[0]]  # noqa: E731
    return record_together([replay], [env], sample, [seed])[0]


def record_together(
    replays: Sequence[Replay],
    envs: Sequence[gym.Env],
    sample: Callable[[np.ndarray, list[int]], Sequence[np.ndarray]],
    seeds: Sequence[int],
) -> list[Trajectory]:
    """One episode per replay, stepped in lockstep: replay k's on ``envs[k]`` reset with
    ``seeds[k]``, each as :func:`record_episode` would play it alone. ``sample(obs, playing)``
    takes the current observations of every replay (``[K, obs_dim]``) and the indices of those
    still playing, and returns one sampled action for each of those, in that order, each drawn
    as that replay alone would draw it (its own generator)."""
    bounds = None
    if isinstance(envs[0].action_space, gym.spaces.Box):
        bounds = (envs[0].action_space.low, envs[0].action_space.high)
    caps = [episode_cap(env) for env in envs]
    obs = [env.reset(seed=seed)[0] for env, seed in zip(envs, seeds, strict=True)]
    played = [_Played([o]) for o in obs]
    playing = list(range(len(envs)))
    while playing:
        actions = sample(np.stack(obs), playing)
        for k, action in zip(playing, actions, strict=True):
            env_action = action if bounds is None else np.clip(action, *bounds)
            obs[k], reward, term, trunc, _ = envs[k].step(env_action)
            played[k].add(obs[k], action, reward, term, trunc, caps[k])
        playing = [k for k in playing if not played[k].over]
    return [p.trajectory(replay) for p, replay in zip(played, replays, strict=True)]


@dataclass
class _Played:
    """One episode as it is played: what :class:`Trajectory` is built from."""

    observations: list
    actions: list = field(default_factory=list)
    rewards: list = field(default_factory=list)
    terminated: list = field(default_factory=list)
    truncated: list = field(default_factory=list)

    def add(self, obs, action, reward, terminated: bool, truncated: bool, cap: int) -> None:
        """One step; the step that reaches the spec's time limit ``cap`` without terminating
        is marked truncated."""
        self.observations.append(obs)
        self.actions.append(action)
        self.rewards.append(reward)
        self.terminated.append(bool(terminated))
        self.truncated.append(bool(truncated or (len(self.rewards) >= cap and not terminated)))

    @property
    def over(self) -> bool:
        return self.terminated[-1] or self.truncated[-1]

    def trajectory(self, replay: Replay) -> Trajectory:
        """Values in one batch (``next_values = values[1:]``) and log-probs under ``replay``."""
        all_obs = np.asarray(self.observations, np.float32)
        all_values = replay.values(all_obs)
        action_array = np.asarray(self.actions)
        with torch.inference_mode():
            log_probs, _ = replay.model.log_probs_and_entropy(
                replay.policy_input(all_obs[:-1]),
                torch.as_tensor(action_array, device=replay.device),
            )
        return Trajectory(
            observations=all_obs[:-1],
            next_observations=all_obs[1:],
            actions=action_array,
            rewards=np.asarray(self.rewards, np.float32),
            values=all_values[:-1],
            next_values=all_values[1:],
            terminated=np.asarray(self.terminated, bool),
            truncated=np.asarray(self.truncated, bool),
            log_probs=log_probs.cpu().numpy().astype(np.float32),
            value_scale=np.float32(replay.value_scale),
        )


def evaluate_values(config: TrainConfig, blob: bytes, observations: np.ndarray) -> np.ndarray:
    """V(s) in env reward units for raw ``observations [T, obs_dim]`` under the critic (and the
    frozen normalisation) of the checkpoint ``blob``; float32 ``[T]``."""
    replay = load_replay(config, blob)
    observations = np.asarray(observations, np.float32)
    obs_dim = replay.model.critic[0].in_features
    if observations.ndim != 2 or observations.shape[1] != obs_dim:
        raise ValueError(f"observations must have shape [T, {obs_dim}], got {observations.shape}")
    return replay.values(observations)


def evaluate_replay(replay: Replay, env_id: str, episodes: int, seed: int) -> list[float]:
    """Returns of ``episodes`` deterministic episodes (argmax / mean actions, clipped to the
    action bounds for the env), one per env of a fresh vector env reset with ``seed``."""
    return evaluate_policies(lambda obs: replay.act(obs[0])[None], env_id, episodes, [seed])[0]


def evaluate_policies(
    act: Callable[[np.ndarray], np.ndarray], env_id: str, episodes: int, seeds: Sequence[int]
) -> list[list[float]]:
    """:func:`evaluate_replay` for several policies at once, one per seed: policy k plays
    ``episodes`` deterministic episodes on envs that start where a fresh vector env of its own
    reset with ``seeds[k]`` starts (the start states it would have alone); ``act`` maps the
    observations of all of them, ``[policies, episodes, obs...]``, to their actions in one
    call. Where the env's native vector env keeps its state as one array (CartPole), several
    policies step in one env (:func:`_joined_native_env`); otherwise, and for one policy alone
    (a single run's evaluation), each has a vector env of its own."""
    if not seeds:
        return []
    joined = _joined_native_env(env_id, episodes, seeds) if len(seeds) > 1 else None
    if joined is not None:
        env, obs = joined
        try:
            return _evaluate_joined(act, env, obs, len(seeds), episodes)
        finally:
            env.close()
    envs: list[gym.vector.VectorEnv] = []
    try:
        for _ in seeds:
            envs.append(make_vector_env(env_id, episodes))  # each closed below, even on failure
        space = envs[0].single_action_space
        bounds = None if isinstance(space, gym.spaces.Discrete) else (space.low, space.high)
        obs = np.stack([env.reset(seed=seed)[0] for env, seed in zip(envs, seeds, strict=True)])
        returns = np.zeros((len(envs), episodes))
        running = np.ones((len(envs), episodes), bool)
        while running.any():
            actions = act(obs)
            if bounds is not None:
                actions = np.clip(actions, *bounds)
            for k in np.flatnonzero(running.any(axis=1)):  # the others' episodes are over
                obs[k], rewards, terminated, truncated, _ = envs[k].step(actions[k])
                returns[k] += np.where(running[k], rewards, 0.0)
                running[k] &= ~(terminated | truncated)
    finally:
        for env in envs:
            env.close()
    return returns.tolist()


def _joined_native_env(
    env_id: str, episodes: int, seeds: Sequence[int]
) -> tuple[gym.vector.VectorEnv, np.ndarray] | None:
    """One vector env of ``episodes × len(seeds)`` envs in which block k starts exactly where
    a fresh ``make_vector_env(env_id, episodes)`` reset with ``seeds[k]`` starts, and its first
    observations ``[policies, episodes, obs_dim]``; None for envs other than CartPole.

    Written for speed, measured: a CartPole vector env step costs about the same for 5 envs
    (68 µs) as for 175 (82 µs), so a population's 35 evaluations stepped one env each spent
    2.4 ms per step where one joined env spends 0.08 ms. gymnasium's ``CartPoleVectorEnv``
    keeps every env's state in one ``state`` array ``[4, num_envs]`` that its step advances
    column by column, with no public way to reset sub-envs from different seeds, so each
    block's start state is read from a vector env of its own reset with its seed and written
    into the joined env's array. ``tests/test_population.py`` checks the returns equal those
    of each policy evaluated alone, and :func:`_joining_works` checks it again at run time
    (gymnasium's internals may change): where it fails, each policy gets an env of its own."""

    if gym.spec(env_id).vector_entry_point is None or not _joining_works(env_id):
        return None
    return _join_blocks(env_id, episodes, seeds)


def _join_blocks(
    env_id: str, episodes: int, seeds: Sequence[int]
) -> tuple[gym.vector.VectorEnv, np.ndarray] | None:
    """:func:`_joined_native_env` without the run-time check."""
    from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv

    blocks = []
    for seed in seeds:
        alone = make_vector_env(env_id, episodes)
        try:
            if not isinstance(alone.unwrapped, CartPoleVectorEnv):
                return None
            alone.reset(seed=seed)
            blocks.append(np.array(alone.unwrapped.state, copy=True))
        finally:
            alone.close()
    env = make_vector_env(env_id, episodes * len(seeds))
    env.reset(seed=seeds[0])
    native = env.unwrapped
    native.state = np.concatenate(blocks, axis=1)
    obs = native.state.T.astype(np.float32)
    return env, obs.reshape(len(seeds), episodes, -1)


@functools.cache
def _joining_works(env_id: str) -> bool:
    """Whether :func:`_joined_native_env` reproduces envs of their own in this gymnasium:
    two blocks from different seeds, stepped a few times with fixed actions, must see exactly
    the observations, rewards and ends that two vector envs of their own see. Checked once
    per process and env (a few milliseconds); a gymnasium whose CartPole keeps its state
    elsewhere fails it and evaluations fall back to an env per policy."""
    episodes, seeds, steps = 2, (11, 12), 8
    alone = [make_vector_env(env_id, episodes) for _ in seeds]
    joined = None
    try:
        expected = [env.reset(seed=seed)[0] for env, seed in zip(alone, seeds, strict=True)]
        joined = _join_blocks(env_id, episodes, seeds)
        if joined is None:
            return False
        env, obs = joined
        actions = np.arange(episodes * len(seeds) * steps) % 2  # CartPole: Discrete(2)
        for t in range(steps):
            if not np.array_equal(obs, np.stack(expected)):
                return False
            chosen = actions[t * episodes * len(seeds) : (t + 1) * episodes * len(seeds)]
            flat, rewards, terminated, truncated, _ = env.step(chosen)
            obs = flat.reshape(len(seeds), episodes, -1)
            mine = [a.step(c) for a, c in zip(alone, chosen.reshape(len(seeds), -1), strict=True)]
            expected = [m[0] for m in mine]
            if not (
                np.array_equal(rewards, np.concatenate([m[1] for m in mine]))
                and np.array_equal(terminated, np.concatenate([m[2] for m in mine]))
                and np.array_equal(truncated, np.concatenate([m[3] for m in mine]))
            ):
                return False
        return bool(np.array_equal(obs, np.stack(expected)))
    except Exception:  # any failure of the internal route means: do not take it
        return False
    finally:
        for env in alone:
            env.close()
        if joined is not None:
            joined[0].close()


def _evaluate_joined(
    act: Callable[[np.ndarray], np.ndarray],
    env: gym.vector.VectorEnv,
    obs: np.ndarray,
    policies: int,
    episodes: int,
) -> list[list[float]]:
    returns = np.zeros((policies, episodes))
    running = np.ones((policies, episodes), bool)
    while running.any():
        actions = np.asarray(act(obs))  # discrete (CartPole): no bounds to clip to
        actions = actions.reshape(policies * episodes, *actions.shape[2:])
        flat, rewards, terminated, truncated, _ = env.step(actions)
        obs = flat.reshape(policies, episodes, -1)
        returns += np.where(running, rewards.reshape(policies, episodes), 0.0)
        running &= ~(terminated | truncated).reshape(policies, episodes)
    return returns.tolist()


def record_replay(replay: Replay, env_id: str, episodes: int, seed: int) -> list[Trajectory]:
    """``episodes`` episodes of the replay's policy (sampled actions) on a fresh single env,
    reset with ``seed``, ``seed + 1``, …; a generator of their own, so nothing else moves."""
    return record_replays([replay], env_id, episodes, [seed])[0]


def record_replays(
    replays: Sequence[Replay],
    env_id: str,
    episodes: int,
    seeds: Sequence[int],
    sample: Callable[[np.ndarray, list[int], list[np.random.Generator]], Sequence[np.ndarray]]
    | None = None,
) -> list[list[Trajectory]]:
    """:func:`record_replay` for several replays at once, one seed each: replay k plays its
    episodes on a fresh env of its own with a generator seeded ``seeds[k]``, exactly as alone;
    episode j of every replay is played in lockstep (:func:`record_together`). ``sample(obs,
    playing, generators)`` draws the actions of the replays still playing from their
    observations ``[K, obs_dim]`` with each one's generator (a population's stacked forward
    pass); by default each replay samples its own."""
    if sample is None:

        def sample(obs, playing, generators):
            return [replays[k].sample(obs[k][None], generators[k])[0] for k in playing]

    generators = [np.random.default_rng(seed) for seed in seeds]
    envs: list[gym.Env] = []
    try:
        for _ in replays:
            envs.append(make_eval_env(env_id))  # each closed below, even on failure
        recorded: list[list[Trajectory]] = [[] for _ in replays]
        for j in range(episodes):
            played = record_together(
                replays,
                envs,
                lambda obs, playing: sample(obs, playing, generators),
                [seed + j for seed in seeds],
            )
            for k, trajectory in enumerate(played):
                recorded[k].append(trajectory)
        return recorded
    finally:
        for env in envs:
            env.close()
