"""Does the trainer's CUDA path give the CPU path's numbers, do its runs open on a CPU machine,
and what does a GPU buy a population? Run where a GPU is present (CI has none):

    python benchmarks/bench_device.py [--updates 3] [--members 1 8 32]

1. **Same numbers.** For A2C and PPO presets (CartPole; Pendulum with gSDE and, for A2C,
   observation and reward normalisation; HalfCheetah with normalisation), three members (λ 0.9,
   0.95, 1.0; seeds 0–2) on the CPU and on CUDA. Target: learning from one rollout, the
   update's gradient agrees within 1e-4 relative (float32 sums run in another order on a GPU).
   Printed beside it, not a target: how far ``--updates`` whole updates drift apart, each
   device collecting its own rollouts (sampling and Adam's first steps carry a rounding
   difference forward; PPO's epochs compound it).
2. **Runs open on a CPU.** A CUDA member's checkpoint (``Trainer.checkpoint_bytes``) loads with
   ``load_replay`` and plays the same deterministic episodes as the trainer's own evaluation;
   ``python -m gae_core train --device cuda`` and a two-λ ``sweep --device cuda --population 2``
   run end to end through the local pool (spawned workers), finish, and their checkpoints load.
3. **Speed.** The HalfCheetah-v5 PPO preset (1 env × 2,048 steps, 10 epochs of 64-row
   minibatches) and A2C preset (8 envs × 8 steps) as populations of ``--members``: env steps
   per second on CPU and CUDA after one warm-up update, and their ratio. Reported, not a
   target: where the update is many small kernels, a GPU can lose.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch

from gae_core.agent.config import TrainConfig
from gae_core.agent.played_together import evaluate_replays
from gae_core.agent.presets import preset_config
from gae_core.agent.recording import load_replay
from gae_core.agent.trainer import Trainer
from gae_core.storage.store import RunStore

ROOT = Path(__file__).resolve().parents[1]
CASES = (
    ("CartPole-v1", "a2c", {}),
    ("CartPole-v1", "ppo", {}),
    ("Pendulum-v1", "a2c", {}),
    ("Pendulum-v1", "ppo", {"rollout_steps": 256}),
    ("HalfCheetah-v5", "a2c", {}),
    ("HalfCheetah-v5", "ppo", {"rollout_steps": 256}),
)  # fmt: skip; PPO rollouts cut so the check is quick
LAMBDAS = (0.9, 0.95, 1.0)
GPU = "cuda"  # --gpu cpu: a dry run of this script on a machine without one


def _configs(env: str, algo: str, device: str, members: int, **extra):
    out = []
    for m in range(members):
        overrides = dict(lambda_=LAMBDAS[m % len(LAMBDAS)], seed=m, device=device, **extra)
        out.append(preset_config(env, algo, **overrides))
    return out


def _gradient_gap(env: str, algo: str, extra: dict) -> tuple[float, bool]:
    """Both trainers learn from one rollout (collected on the CPU): the largest member's
    relative gradient difference ‖g_cpu − g_gpu‖ / ‖g_cpu‖ of the update's last step (after
    clipping), and whether gSDE is on."""
    cpu, gpu = (Trainer(_configs(env, algo, d, 3, **extra)) for d in ("cpu", GPU))
    active = [0, 1, 2]
    cpu.collect(active)
    gpu._batch = cpu._batch  # the same rows (normalised observations, scaled rewards)
    for mine, theirs in zip(cpu._members, gpu._members, strict=True):
        theirs.env_steps = mine.env_steps
    cpu.update(active)
    gpu.update(active)
    mine, theirs = cpu.parameters.grad.double(), gpu.parameters.grad.cpu().double()
    gap = ((mine - theirs).norm(dim=1) / mine.norm(dim=1)).max().item()
    sde = cpu.sde
    cpu.close()
    gpu.close()
    return gap, sde


def same_numbers(updates: int) -> bool:
    print("1. CPU against CUDA, 3 members from the same seeds. Target: on one rollout, the "
          "update's gradient (A2C's step; PPO's second step of 2 full-batch epochs, where the "
          f"clip binds) within 1e-4 relative. Printed beside it: the drift after {updates} "
          "whole updates, each device collecting its own rollouts")  # fmt: skip
    ok = True
    for env, algo, extra in CASES:
        rows = preset_config(env, algo, **extra).num_envs * extra.get(
            "rollout_steps", preset_config(env, algo).rollout_steps
        )
        gap, sde = _gradient_gap(env, algo, {**extra, "n_epochs": 2, "minibatch_size": rows}
                                 if algo == "ppo" else extra)  # fmt: skip
        losses, last = {}, {}
        for device in ("cpu", GPU):
            trainer = Trainer(_configs(env, algo, device, 3, **extra))
            history = []
            for _ in range(updates):
                result = trainer.step()
                history.append(
                    [
                        v
                        for i in sorted(result)
                        for k, v in sorted(result[i].metrics.items())
                        if "loss" in k
                    ]
                )
            losses[device] = np.array(history, np.float64)
            last[device] = trainer.parameters.detach().cpu().double()
            trainer.close()
        drift = ((last["cpu"] - last[GPU]).abs().max() / last["cpu"].abs().max()).item()
        loss_gap = np.abs(losses["cpu"] - losses[GPU]) / np.maximum(np.abs(losses["cpu"]), 1.0)
        verdict = "PASS" if gap <= 1e-4 else "FAIL"
        ok &= verdict == "PASS"
        label = algo + (" gSDE" if sde else "")
        print(
            f"  {env:>15} {label:8}: gradient {gap:.2e}  {verdict} (≤ 1e-4); after {updates} "
            f"updates: max |Δθ|/max |θ| {drift:.2e}, losses {float(loss_gap.max()):.2e}"
        )
    return ok


def opens_on_cpu() -> bool:
    print("2. CUDA runs open on the CPU")
    ok = True
    trainer = Trainer(_configs("Pendulum-v1", "a2c", GPU, 2))
    for _ in range(5):
        trainer.step()
    blob = trainer.checkpoint_bytes(1)
    replay = load_replay(trainer.configs[1], blob)
    on_cpu = all(p.device.type == "cpu" for p in replay.model.parameters())
    ours = trainer.evaluate(1, 2, seed=7)
    theirs = evaluate_replays([replay], "Pendulum-v1", 2, [7])[0]
    same = on_cpu and np.allclose(ours, theirs, rtol=0, atol=1e-6)
    ok &= same
    trainer.close()
    print(f"  checkpoint → load_replay: parameters on CPU {on_cpu}; evaluation {ours} vs "
          f"{theirs}  {'PASS' if same else 'FAIL'}")  # fmt: skip
    with tempfile.TemporaryDirectory() as data:
        env = {**os.environ, "GAE_CORE_DATA": data, "PYTHONUNBUFFERED": "1"}
        for label, args in (
            ("train", ["train", "--env", "CartPole-v1", "--total-steps", "20000"]),
            ("sweep", ["sweep", "--env", "Pendulum-v1", "--lambdas", "0.9", "1.0", "--seeds", "0",
                       "--total-steps", "8000", "--population", "2", "--workers", "1"]),
        ):  # fmt: skip
            started = time.perf_counter()
            done = subprocess.run(
                [sys.executable, "-m", "gae_core", *args, "--device", GPU, "--json",
                 "--no-progress"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
            )  # fmt: skip
            wall = time.perf_counter() - started
            tail = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
            try:
                summary = json.loads(tail)
            except json.JSONDecodeError:
                summary = {}
            good = done.returncode == 0
            ok &= good
            print(
                f"  {label} --device cuda: exit {done.returncode} in {wall:.1f} s; "
                f"{json.dumps(summary)[:300]}  {'PASS' if good else 'FAIL'}"
            )
            if not good:
                print("    stderr:", done.stderr[-1500:])
        store = RunStore(data)
        runs = store.list_runs()
        loaded = 0
        for run in runs:
            config = TrainConfig.from_stored(run.config)
            for step in store.checkpoint_steps(run.id):
                replay = load_replay(config, store.load_checkpoint(run.id, step))
                loaded += all(p.device.type == "cpu" for p in replay.model.parameters())
        statuses = sorted(r.status for r in runs)
        good = statuses == ["finished"] * 3 and loaded > 0
        ok &= good
        print(
            f"  runs in the store: {statuses}; checkpoints loaded on the CPU: {loaded}  "
            f"{'PASS' if good else 'FAIL'}"
        )
    return ok


def speed(members: list[int]) -> None:
    print("3. Env steps/s of HalfCheetah-v5 populations (one warm-up update, then timed ones)")
    for algo, timed in (("ppo", 2), ("a2c", 60)):
        for m in members:
            rates = {}
            for device in ("cpu", GPU):
                trainer = Trainer(_configs("HalfCheetah-v5", algo, device, m))
                trainer.step()
                if device == "cuda":
                    torch.cuda.synchronize()
                before = sum(trainer.member(i).env_steps for i in range(m))
                started = time.perf_counter()
                for _ in range(timed):
                    trainer.step()
                if device == "cuda":
                    torch.cuda.synchronize()
                wall = time.perf_counter() - started
                rates[device] = (sum(trainer.member(i).env_steps for i in range(m)) - before) / wall
                trainer.close()
            print(
                f"  {algo} M = {m:3d}: CPU {rates['cpu']:9.0f}  CUDA {rates[GPU]:9.0f}  "
                f"CUDA/CPU {rates[GPU] / rates['cpu']:.4f}"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--updates", type=int, default=3)
    parser.add_argument("--members", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--gpu", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--only", choices=("numbers", "cpu", "speed"), nargs="*")
    args = parser.parse_args()
    global GPU
    GPU = args.gpu
    if GPU == "cuda" and not torch.cuda.is_available():
        print("no CUDA device here: nothing to check")
        return 2
    name = torch.cuda.get_device_name() if GPU == "cuda" else "no GPU (dry run)"
    print(f"torch {torch.__version__} on {name}; "
          f"{os.cpu_count()} CPUs")  # fmt: skip
    only = set(args.only or ("numbers", "cpu", "speed"))
    ok = True
    if "numbers" in only:
        ok &= same_numbers(args.updates)
    if "cpu" in only:
        ok &= opens_on_cpu()
    if "speed" in only:
        speed(args.members)
    print("ALL PASS" if ok else "SOME FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
