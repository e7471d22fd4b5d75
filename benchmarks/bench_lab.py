"""Speed of the estimator lab: all rollouts batched against a one-rollout-at-a-time loop.

CartPole-v1, a policy trained for 150k steps with the CartPole preset (seed 0), the lab's defaults
otherwise: 64 states × 32 continuations × 101 λ, segment 500, 32 truth rollouts per state for
Q^π and for V^π. Target: the whole measurement in ≤ 30 s on this 2-core machine.

The baseline does the same work the straightforward way — one env, one rollout at a time, one
policy forward per step — on the first 2 states (it would take many minutes on all 64); both are
compared in env steps per second, measured in the same run.

    python benchmarks/bench_lab.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere

import gymnasium as gym
import numpy as np
import torch

from gae_core.agent.presets import preset_config
from gae_core.agent.recording import load_replay
from gae_core.agent.trainer import Trainer
from gae_core.lab.measure import LabSettings, measure, sample_starts
from gae_core.lab.states import state_access

TARGET_S = 30.0


def trained_policy():
    config = preset_config("CartPole-v1", total_steps=150_000, checkpoint_every=0,
                           record_episodes=0, eval_every=0)  # fmt: skip
    trainer = Trainer(config)
    while not trainer.done:
        trainer.step()
    replay = load_replay(config, trainer.checkpoint_bytes())
    trainer.close()
    return replay


def naive(replay, starts, settings: LabSettings) -> tuple[int, float]:
    """The same rollouts, one at a time: (env steps, seconds)."""
    env = gym.make("CartPole-v1").unwrapped
    access = state_access("CartPole-v1")
    rng = np.random.default_rng(0)
    steps, started = 0, time.perf_counter()
    for state, _, action in starts:
        for first, length, count in (
            (action, settings.truth_horizon, settings.rollouts),  # Q^π
            (None, settings.truth_horizon, settings.rollouts),  # V^π
            (action, settings.segment, settings.continuations),  # estimator continuations
        ):
            for _ in range(count):
                access.set(env, state)
                env.steps_beyond_terminated = None  # a restored state is a live one
                obs = access.observe(env)
                for t in range(length):
                    a = first if t == 0 and first is not None else replay.sample(obs[None], rng)[0]
                    obs, _, terminated, _, _ = env.step(int(a))
                    steps += 1
                    if terminated:
                        break
                if length == settings.segment:  # value the continuation, as the lab does
                    with torch.inference_mode():
                        replay.values(obs[None])
    return steps, time.perf_counter() - started


def main() -> None:
    torch.set_num_threads(1)
    replay = trained_policy()
    settings = LabSettings(gamma=0.99)
    started = time.perf_counter()
    result = measure("CartPole-v1", replay, replay, settings)
    batched_s = time.perf_counter() - started
    batched_rate = result.env_steps / batched_s
    rng = np.random.default_rng(1)
    starts = sample_starts("CartPole-v1", replay, 2, rng, 1)
    naive_steps, naive_s = naive(replay, starts, settings)
    naive_rate = naive_steps / naive_s
    print(
        f"lab, batched: {result.env_steps:,} env steps in {batched_s:.2f} s "
        f"({batched_rate:,.0f} steps/s), 64 states x 32 continuations x 101 lambda, L = 500"
    )
    print(f"one rollout at a time (2 states of the same work): {naive_steps:,} steps in "
          f"{naive_s:.2f} s ({naive_rate:,.0f} steps/s)")  # fmt: skip
    print(f"throughput ratio batched / one-at-a-time = {batched_rate / naive_rate:.2f}x")
    ok = batched_s <= TARGET_S
    print(f"wall time {batched_s:.2f} s vs target <= {TARGET_S:.0f} s: {'PASS' if ok else 'FAIL'}")
    print(f"least MSE at lambda = {result.best_lambda():g} (this policy's own critic)")


if __name__ == "__main__":
    main()
