"""The advantage explorer's data: trajectories (recorded, fresh, re-valued with another
checkpoint's critic) and the tables built from them — the per-step estimates, the (t, λ) heat
map and the estimator weights.

Every table is a pandas DataFrame with self-describing column names (the CSV exports are these
frames, unchanged); :mod:`gae_core.insight.figures` draws them. An early critic next to a late one
shows how critic error becomes bias in the advantages.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import pandas as pd

from gae_core import estimators
from gae_core.agent.config import FIELD_SPECS, TrainConfig, with_stored_defaults
from gae_core.agent.envs import make_eval_env
from gae_core.agent.field_spec import int_problem
from gae_core.agent.recording import load_replay, record_episode
from gae_core.storage.store import RunStore
from gae_core.trajectory import Trajectory


def gae_column(lambda_: float) -> str:
    return f"gae[lambda={lambda_:g}]"


def k_step_column(k: int) -> str:
    return f"k_step[k={k}]"


# ----------------------------------------------------------------------------- explorer


def advantage_table(
    rewards: np.ndarray,
    values: np.ndarray,
    next_values: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    *,
    gamma: float,
    lambdas: Sequence[float],
    ks: Sequence[int] = (),
) -> pd.DataFrame:
    """One row per step t of a 1-D trajectory: inputs, flags, δ_t, each Â^(k)_t and GAE at each λ.

    Columns: ``t``, ``reward``, ``value`` (V(s_t)), ``next_value`` (V(s_{t+1})), ``terminated``,
    ``truncated``, ``end_of_rollout`` (the implicit cut after the last row), ``steps_left``
    (L_t, steps to the end of t's segment, inclusive), ``delta``, ``k_step[k=K]`` for each K, and
    ``gae[lambda=L]`` for each λ. Every estimate comes from :mod:`gae_core.estimators`.
    """
    rewards, values, next_values = (np.asarray(x) for x in (rewards, values, next_values))
    if rewards.ndim != 1:
        raise ValueError(f"rewards must be a 1-D trajectory [T], got shape {rewards.shape}")
    terminated = np.asarray(terminated, dtype=bool)
    truncated = np.asarray(truncated, dtype=bool)
    args = (rewards, values, next_values, terminated, truncated)
    steps = len(rewards)
    end = np.zeros(steps, dtype=bool)
    if steps:
        end[-1] = True
    table = pd.DataFrame(
        {
            "t": np.arange(steps),
            "reward": rewards,
            "value": values,
            "next_value": next_values,
            "terminated": terminated,
            "truncated": truncated,
            "end_of_rollout": end,
            "steps_left": steps_left(terminated, truncated),
            "delta": estimators.td_residuals(*args[:4], gamma=gamma),
        }
    )
    if len(ks):
        stacked = estimators.k_step_advantages(*args, gamma=gamma, k=list(ks))
        for k, column in zip(ks, stacked, strict=True):
            table[k_step_column(k)] = column
    if len(lambdas):
        sweep = estimators.gae_lambda_sweep(*args, gamma=gamma, lambdas=list(lambdas))
        for lambda_, column in zip(lambdas, sweep, strict=True):
            table[gae_column(lambda_)] = column
    return table


#: The explorer's λ grid: one gae_lambda_sweep over it serves the slider, the pins and the map.
LAMBDA_GRID = np.round(np.linspace(0.0, 1.0, 101), 2)


def lambda_index(lambda_: float, grid: np.ndarray = LAMBDA_GRID) -> int:
    """Position of ``lambda_`` in ``grid``; a ValueError names the grid when it is not on it."""
    hits = np.flatnonzero(np.isclose(grid, lambda_, rtol=0.0, atol=1e-9))
    if not len(hits):
        raise ValueError(f"lambda {lambda_} is not on the grid (steps of {grid[1] - grid[0]:g})")
    return int(hits[0])


def with_gae_columns(
    table: pd.DataFrame, sweep: np.ndarray, lambdas: Sequence[float], grid: np.ndarray = LAMBDA_GRID
) -> pd.DataFrame:
    """``table`` plus ``gae[lambda=L]`` columns read from a precomputed ``[len(grid), T]``
    sweep: moving the λ slider costs a column copy, not a recomputation."""
    table = table.copy()
    for lambda_ in dict.fromkeys(lambdas):
        table[gae_column(lambda_)] = sweep[lambda_index(lambda_, grid)]
    return table


def heatmap_from_sweep(sweep: np.ndarray, grid: np.ndarray = LAMBDA_GRID) -> pd.DataFrame:
    """Long frame ``lambda_, t, gae`` from a ``[len(grid), T]`` sweep."""
    steps = sweep.shape[1]
    return pd.DataFrame(
        {
            "lambda_": np.repeat(grid, steps),
            "t": np.tile(np.arange(steps), len(grid)),
            "gae": sweep.reshape(-1),
        }
    )


def steps_left(terminated: np.ndarray, truncated: np.ndarray) -> np.ndarray:
    """L_t: steps from t to the end of its segment, inclusive (first done step, or row T−1)."""
    done = np.asarray(terminated, dtype=bool) | np.asarray(truncated, dtype=bool)
    out = np.empty(len(done), dtype=np.int64)
    remaining = 0
    for t in range(len(done) - 1, -1, -1):
        remaining = 1 if (done[t] or t == len(done) - 1) else remaining + 1
        out[t] = remaining
    return out


def gae_heatmap(
    rewards: np.ndarray,
    values: np.ndarray,
    next_values: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    *,
    gamma: float,
    lambdas: Sequence[float] | None = None,
) -> pd.DataFrame:
    """GAE over (t, λ) in long form: columns ``lambda_``, ``t``, ``gae`` (one
    :func:`~gae_core.estimators.gae_lambda_sweep` call; λ defaults to 0, 0.01, …, 1)."""
    grid = LAMBDA_GRID if lambdas is None else np.asarray(lambdas, dtype=float)
    sweep = estimators.gae_lambda_sweep(
        rewards, values, next_values, terminated, truncated, gamma=gamma, lambdas=grid
    )
    return heatmap_from_sweep(sweep, grid)


def weights_table(lambda_: float, horizon: int) -> pd.DataFrame:
    """Weight of each Â^(k), k = 1..H, in GAE at a step with H steps left in its segment.

    Columns: ``k``, ``weight`` (from :func:`~gae_core.estimators.estimator_weights`),
    ``geometric_weight`` ((1−λ)λ^(k−1), the infinite-horizon weight) and ``tail`` (True on the
    last row, whose weight λ^(H−1) is all the geometric mass of k ≥ H piled on Â^(H)).
    """
    weights = estimators.estimator_weights(lambda_, horizon)
    k = np.arange(1, horizon + 1)
    return pd.DataFrame(
        {
            "k": k,
            "weight": weights,
            "geometric_weight": (1.0 - lambda_) * float(lambda_) ** (k - 1.0),
            "tail": k == horizon,
        }
    )


# ----------------------------------------------------------------------------- trajectories


def units_note(config: dict, value_scale: float) -> str:
    """What the explorer's numbers are in: rewards are always the env's own; values are the
    critic's output converted to the same units where the run scales rewards."""
    if config.get("normalize_rewards"):
        note = (
            "Units: rewards are the env's own. The run scales rewards for learning, so the "
            f"critic's output is multiplied by σ = {value_scale:.4g} (the return std at this "
            "checkpoint): V, δ, Â and GAE are all in env reward units."
        )
        clip = with_stored_defaults(config)["normalize_clip"]
        if clip:
            note += (
                f" Its learning clipped scaled rewards at ±{clip:g} (env rewards beyond "
                f"±{clip * value_scale:.4g} now), which this conversion does not undo."
            )
        return note
    return "Units: rewards are the env's own; V, δ, Â and GAE are in the same units."


def record_fresh(config: TrainConfig, checkpoint: bytes, seed: int) -> Trajectory:
    """One evaluation episode of the checkpoint's policy (sampled actions), env reset with
    ``seed``; values from the same checkpoint's critic."""
    spec = FIELD_SPECS["seed"]
    if problem := int_problem("seed", seed, spec.min, spec.max):
        raise ValueError(problem)
    seed, replay = int(seed), load_replay(config, checkpoint)
    env = make_eval_env(config.env_id)
    try:
        return record_episode(env, replay, np.random.default_rng(seed), seed)
    finally:
        env.close()


def revalue(trajectory: Trajectory, config: TrainConfig, checkpoint: bytes) -> Trajectory:
    """The same transitions with ``values`` and ``next_values`` from another checkpoint's
    critic; rewards, flags and actions untouched. One batch over s_0..s_T, so
    ``next_values[t] == values[t + 1]`` holds exactly inside the (single-episode) trajectory."""
    states = np.concatenate([trajectory.observations, trajectory.next_observations[-1:]])
    replay = load_replay(config, checkpoint)
    all_values = replay.values(states)  # env reward units, this checkpoint's own statistics
    return dataclasses.replace(
        trajectory,
        values=all_values[:-1],
        next_values=all_values[1:],
        value_scale=np.float32(replay.value_scale),
    )


def load_trajectory(
    store: RunStore,
    run_id: str,
    policy_step: int,
    *,
    recorded: int | None = None,
    fresh_seed: int | None = None,
    critic_step: int | None = None,
) -> Trajectory:
    """A trajectory of ``run_id``'s checkpoint at ``policy_step``: the ``recorded``-th one saved
    with it, or a ``fresh_seed`` recording of its policy; values from the checkpoint at
    ``critic_step`` when given (else the policy's own critic)."""
    if (recorded is None) == (fresh_seed is None):
        raise ValueError("give exactly one of recorded (an index) or fresh_seed")
    config = TrainConfig.from_stored(store.get_run(run_id).config)
    if recorded is not None:
        saved = [Trajectory.from_bytes(b) for b in store.trajectory_blobs(run_id, policy_step)]
        if not 0 <= recorded < len(saved):
            raise ValueError(
                f"recorded must be in [0, {len(saved) - 1}] for checkpoint {policy_step}, "
                f"got {recorded}"
            )
        trajectory = saved[recorded]
    else:
        trajectory = record_fresh(config, store.load_checkpoint(run_id, policy_step), fresh_seed)
    if critic_step is not None and critic_step != policy_step:
        trajectory = revalue(trajectory, config, store.load_checkpoint(run_id, critic_step))
    return trajectory
