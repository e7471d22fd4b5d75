"""The gradient lens's cost, against the naive way, in one script run.

    python benchmarks/bench_gradient.py [--env CartPole-v1 | HalfCheetah-v5] [--batches 32]
                                        [--batch-size 2048] [--reference 500000] [--skip-naive]

Measures :func:`gae_core.lab.gradient.measure_gradient` at 101 λ (0, 0.01, …, 1) and the
default k's, K batches of ``--batch-size`` samples (8 envs × size/8 steps) and a reference of
``--reference`` samples, on a CartPole-v1 checkpoint trained here from its A2C preset for 100k
steps (episodes as long as a learning policy's) or, for a MuJoCo env, a freshly initialised
network (its episodes always last the time limit, so the cost does not depend on the policy).

Prints the lens's wall time against the issue's targets (CartPole ≤ 60 s, HalfCheetah-v5
≤ 300 s), its peak memory (the process's max RSS; target ≤ 2 GB), and, on the same batches and
advantages, the time of the gradients alone both ways: per-sample scores once and one product
per batch (the lens) against autograd once per λ and batch (the naive baseline), with the ratio.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gymnasium as gym
import numpy as np
import torch
from bench_study import _cpu_model

from gae_core.agent.policy import ActorCritic
from gae_core.agent.presets import preset_config
from gae_core.agent.recording import Replay, load_replay
from gae_core.lab import gradient, gradient_samples
from gae_core.lab.rollouts import Progress
from gae_core.runs.sweep import grid_of, run_sweep
from gae_core.storage.store import RunStore

TARGETS_S = {"CartPole-v1": 60.0, "HalfCheetah-v5": 300.0}
MEMORY_TARGET_GB = 2.0


def _policy(env_id: str) -> Replay:
    if env_id != "CartPole-v1":
        env = gym.make(env_id)
        return Replay(ActorCritic(env.observation_space, env.action_space, (64, 64), seed=0))
    config = preset_config(env_id, "a2c", total_steps=100_000, checkpoint_every=100_000)
    store = RunStore(Path(tempfile.mkdtemp(prefix="bench-gradient-")))
    sweep = run_sweep(store, config, grid_of(seeds=[0]), workers=1)
    (run,) = store.list_runs(sweep_id=sweep.sweep_id)
    blob = store.load_checkpoint(run.id)
    print(f"checkpoint: CartPole-v1 A2C preset, 100,000 steps, final return "
          f"{run.summary.final_return}")  # fmt: skip
    return load_replay(config, blob)


def _naive(windows, policy: Replay, advantages: list[np.ndarray]) -> float:
    """Seconds for autograd of mean(log π · Â) once per estimator and batch."""
    model = policy.model
    params = [p for name, p in model.named_parameters() if name.startswith("actor.")
              or name == "log_std"]  # fmt: skip
    began = time.perf_counter()
    for k, adv in enumerate(advantages):
        keep = windows.valid[k]
        obs = policy.policy_input(windows.obs[k][keep])
        actions = gradient_samples.action_tensor(windows.actions[k][keep])
        for e in range(adv.shape[0]):
            log_probs, _ = model.log_probs_and_entropy(obs, actions)
            loss = (log_probs * torch.as_tensor(adv[e], dtype=torch.float32)).mean()
            torch.autograd.grad(loss, params)
    return time.perf_counter() - began


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--batches", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=2048)
    parser.add_argument("--reference", type=int, default=500_000)
    parser.add_argument("--skip-naive", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    policy = _policy(args.env)
    envs, steps = 8, args.batch_size // 8
    settings = gradient.GradientSettings(
        gamma=0.99, batches=args.batches, batch_size=envs * steps, reference=args.reference
    )
    began = time.perf_counter()
    result = gradient.measure_gradient(args.env, policy, [policy], settings, envs=envs, steps=steps)
    wall = time.perf_counter() - began
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    target = TARGETS_S.get(args.env)
    estimators = len(settings.estimators())
    print(f"{args.env} · {estimators} estimators (101 λ + {len(settings.ks)} k) · "
          f"{args.batches} batches × {envs * steps:,} · reference {result.reference['samples']:,} "
          f"samples · {_cpu_model()}")  # fmt: skip
    verdict = "" if target is None else f" (target ≤ {target:.0f} s: "
    verdict += "" if target is None else ("PASS)" if wall <= target else "FAIL)")
    print(
        f"lens wall {wall:.2f} s{verdict}; peak memory {peak_gb:.3f} GB (target ≤ "
        f"{MEMORY_TARGET_GB:.1f} GB: {'PASS' if peak_gb <= MEMORY_TARGET_GB else 'FAIL'})"
    )
    print(f"least gradient MSE at λ = {result.best_lambda():g}")
    if args.skip_naive:
        return 0
    # the gradients alone, both ways, on the same batches and advantages
    windows = gradient_samples.sample_windows(args.env, policy, args.batches, envs, steps, 0,
                                Progress(1, None, None))  # fmt: skip
    advantages = [
        gradient_samples.window_advantages(windows, policy, k, settings)
        for k in range(args.batches)
    ]
    began = time.perf_counter()
    for k, adv in enumerate(advantages):
        keep = windows.valid[k]
        scores = gradient_samples.per_sample_scores(
            policy.model, policy.policy_input(windows.obs[k][keep]),
            gradient_samples.action_tensor(windows.actions[k][keep]),
        )  # fmt: skip
        gradient_samples.batch_gradients(scores, adv)
    lens = time.perf_counter() - began
    naive = _naive(windows, policy, advantages)
    ratio = naive / lens
    print(f"gradients of {args.batches} batches × {estimators} estimators: lens {lens:.3f} s, "
          f"naive autograd per estimator and batch {naive:.3f} s → naive/lens = {ratio:.4f} "
          f"({'PASS' if ratio > 1.0 else 'FAIL'}: the lens must be faster)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
