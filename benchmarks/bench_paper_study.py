"""The GAE paper's experiment, rerunnable: a λ study on HalfCheetah-v5 and a γ × λ grid on
CartPole, with their uncertainty and wall time.

    python benchmarks/bench_paper_study.py halfcheetah --algo a2c   # or --algo ppo
    python benchmarks/bench_paper_study.py cartpole-grid
    python benchmarks/bench_paper_study.py halfcheetah --from-sweep ID --data-dir D  # analyse

``halfcheetah``: λ ∈ {0, 0.9, 0.96, 0.99, 1} × 10 seeds × 1M env steps at the algorithm's
preset (:func:`gae_core.agent.presets.preset_config`), the critic's target held fixed (every
trial's critic regresses on the preset's λ-returns: only the advantages' λ varies), on the
local pool with populations (the ``sweep`` command's defaults). Prints, per λ, the IQM and
mean of the final return and of the AUC with 95 % stratified-bootstrap intervals over seeds
(:func:`gae_core.insight.stats.stratified_bootstrap_ci`, one task), the probability that the
best intermediate λ (0 < λ < 1, by final-return IQM) beats λ = 1 and λ = 0 with its interval,
the wall time (grid submitted → every trial closed) and the aggregate env steps/s beside the
physics ceiling (gymnasium's own step with random actions, one vector env per worker, measured
in the same run), with PASS/FAIL against the targets: ≤ 20 min and ≥ 80 % of the ceiling.

``cartpole-grid``: γ ∈ {0.96, 0.98, 0.99, 0.995} × λ ∈ {0.8, 0.9, 0.96, 0.99, 1} × 10 seeds ×
200k steps at CartPole's A2C preset (the paper's figure 2 layout), critic target held fixed;
prints the AUC grid (:func:`gae_core.insight.grid.cell_table`), the best cell and those not
distinguishable from it, and the wall time against ≤ 3 min.

``--from-sweep ID`` analyses a sweep already in ``--data-dir`` instead of running one (its wall
time is its record's ``created_at`` → ``ended_at``). Each result is appended as one JSON line
to ``benchmarks/results/paper_study.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
from bench_study import _cpu_model, physics_ceiling

from gae_core.agent.presets import preset_config
from gae_core.insight import compare, grid, stats
from gae_core.labels import assignment
from gae_core.runs.backends import DEFAULT_MEMBERS, backend_factory
from gae_core.runs.sweep import grid_of, hold_critic_target, run_sweep
from gae_core.storage.store import RunStore

RESULTS = Path(__file__).resolve().parent / "results" / "paper_study.jsonl"
LAMBDAS = (0.0, 0.9, 0.96, 0.99, 1.0)
GRID_GAMMAS = (0.96, 0.98, 0.99, 0.995)
GRID_LAMBDAS = (0.8, 0.9, 0.96, 0.99, 1.0)
HALFCHEETAH_TARGET_S, CEILING_TARGET, GRID_TARGET_S = 20 * 60.0, 0.80, 3 * 60.0


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def _run_or_load(args, base, axes: dict) -> tuple[RunStore, str, float]:
    """The sweep's store, id and wall seconds: run now, or read back with --from-sweep."""
    data = Path(args.data_dir or tempfile.mkdtemp(prefix="paper-study-"))
    store = RunStore(data, recover=not args.from_sweep)  # a store in use elsewhere: read only
    if args.from_sweep:
        sweep = store.get_sweep(args.from_sweep)
        if sweep.ended_at is None:
            raise SystemExit(f"sweep {args.from_sweep} has not ended ({sweep.status})")
        return store, sweep.id, sweep.ended_at - sweep.created_at
    held = hold_critic_target(base, axes)
    # populations, as `sweep` and the compare page run a study (run_sweep alone: one per worker)
    backend = backend_factory("local", None, members=DEFAULT_MEMBERS)
    start = time.perf_counter()
    progress = run_sweep(store, held, axes, workers=args.workers, name=args.name, backend=backend)
    return store, progress.sweep_id, time.perf_counter() - start


def _check_finished(store: RunStore, sweep_id: str) -> list:
    runs = store.list_runs(sweep_id=sweep_id)
    if not any(r.summary.episodes for r in runs):
        raise SystemExit(f"sweep {sweep_id}: no trial finished an episode (budget too small?)")
    unfinished = [r.id for r in runs if r.status != "finished"]
    if unfinished:
        print(f"WARNING: {len(unfinished)} trials did not finish: {unfinished[:5]}")
    return runs


def halfcheetah(args) -> dict:
    base = preset_config("HalfCheetah-v5", args.algo, total_steps=args.steps)
    axes = grid_of(lambdas=list(LAMBDAS), seeds=list(range(args.seeds)))
    ceiling = physics_ceiling(base.env_id, base.num_envs, args.workers)
    store, sweep_id, wall = _run_or_load(args, base, axes)
    runs = _check_finished(store, sweep_id)
    episodes = compare.episodes_frame(store, [r.id for r in runs], "lambda_")
    scores = compare.seed_scores(episodes, group="lambda_")
    steps = sum(r.env_steps for r in runs)
    print(f"HalfCheetah-v5 · {args.algo.upper()} preset · {len(LAMBDAS)} λ × {args.seeds} seeds "
          f"× {args.steps:,} steps · sweep {sweep_id} · {_cpu_model()}")  # fmt: skip
    print(f"{'λ':>6}{'seeds':>6}  {'final IQM [95 % CI]':<30}{'final mean [95 % CI]':<30}"
          f"{'AUC IQM [95 % CI]':<30}{'AUC mean [95 % CI]':<30}")  # fmt: skip
    rows = []
    for lam, frame in scores.groupby("lambda_", sort=True):
        row: dict = {"lambda": float(lam), "seeds": len(frame)}
        cells = []
        for score in ("final_return", "auc"):
            for statistic in ("iqm", "mean"):
                point, low, high = stats.stratified_bootstrap_ci([frame[score]], statistic)
                row[f"{score}_{statistic}"] = [point, low, high]
                cells.append(f"{point:,.1f} [{low:,.1f}, {high:,.1f}]")
        rows.append(row)
        print(f"{lam:>6g}{len(frame):>6}  " + "".join(f"{c:<30}" for c in cells))
    finals = {float(k): f["final_return"].to_numpy() for k, f in scores.groupby("lambda_")}
    middle = [lam for lam in finals if 0.0 < lam < 1.0]
    best = max(middle, key=lambda lam: (stats.iqm(finals[lam]), np.mean(finals[lam])))
    beats = {}
    for other in (1.0, 0.0):
        if other in finals:
            p, low, high = stats.probability_of_improvement(finals[best], finals[other])
            beats[str(other)] = [p, low, high]
            tie = "  (interval includes ½: not distinguishable)" * (low <= 0.5 <= high)
            print(f"P({assignment('lambda_', best)} beats {assignment('lambda_', other)}) on final "
                  f"return = {p:.3f} [{low:.3f}, {high:.3f}]{tie}")  # fmt: skip
    rate = steps / wall
    print(f"wall {wall:,.1f} s for {steps:,} env steps: {rate:,.0f} env steps/s aggregate; "
          f"physics ceiling {ceiling:,.0f}/s → ratio {rate / ceiling:.4f} "
          f"(target ≥ {CEILING_TARGET:.2f}: {_verdict(rate / ceiling >= CEILING_TARGET)}); "
          f"wall target ≤ {HALFCHEETAH_TARGET_S:,.0f} s: "
          f"{_verdict(wall <= HALFCHEETAH_TARGET_S)}")  # fmt: skip
    return {"study": "halfcheetah", "algo": args.algo, "sweep_id": sweep_id, "steps": args.steps,
            "seeds": args.seeds, "wall_s": wall, "env_steps": steps, "ceiling": ceiling,
            "rows": rows, "best_intermediate": best, "p_beats": beats}  # fmt: skip


def cartpole_grid(args) -> dict:
    base = preset_config("CartPole-v1", "a2c", total_steps=args.steps)
    axes = grid_of(lambdas=list(GRID_LAMBDAS), seeds=list(range(args.seeds)),
                   gamma=list(GRID_GAMMAS))  # fmt: skip
    store, sweep_id, wall = _run_or_load(args, base, axes)
    runs = _check_finished(store, sweep_id)
    episodes = compare.episodes_frame(store, [r.id for r in runs], "lambda_", also=("gamma",))
    threshold = runs[0].summary.reward_threshold
    table = grid.cell_table(episodes, "lambda_", "gamma", score=args.score, threshold=threshold)
    print(f"CartPole-v1 · A2C preset · {len(GRID_GAMMAS)} γ × {len(GRID_LAMBDAS)} λ × "
          f"{args.seeds} seeds × {args.steps:,} steps · sweep {sweep_id} · "
          f"{_cpu_model()}")  # fmt: skip
    print(f"IQM of {grid.SCORES[args.score][0]} [95 % CI]")
    print(f"{'γ / λ':>8}  " + "".join(f"{lam:<24g}" for lam in GRID_LAMBDAS))
    for gamma in GRID_GAMMAS:
        cells = []
        for lam in GRID_LAMBDAS:
            r = table[(table.lambda_ == lam) & (table.gamma == gamma)].iloc[0]
            mark = "★" if r.best else "≈" if r.not_distinguishable else " "
            cells.append(f"{mark}{r.iqm:,.1f} [{r.iqm_ci_low:,.1f}, {r.iqm_ci_high:,.1f}]")
        print(f"{gamma:>8g}  " + "".join(f"{c:<24}" for c in cells))
    print(grid.best_cell_sentence(table, "lambda_", "gamma", assignment) + ".")
    print(" ".join(grid.MARKS.values()))
    print(
        f"wall {wall:,.1f} s for {len(runs)} trials (target ≤ {GRID_TARGET_S:.0f} s: "
        f"{_verdict(wall <= GRID_TARGET_S)})"
    )
    return {"study": "cartpole-grid", "score": args.score, "sweep_id": sweep_id,
            "steps": args.steps, "seeds": args.seeds, "wall_s": wall,
            "cells": grid.cell_records(table, "lambda_", "gamma")}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("study", choices=("halfcheetah", "cartpole-grid"))
    parser.add_argument("--algo", choices=("a2c", "ppo"), default="a2c")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=None, help="per trial (default 1M / 200k)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--score", choices=list(grid.SCORES), default="auc")
    parser.add_argument("--data-dir", default=None, help="default: a fresh temporary folder")
    parser.add_argument("--from-sweep", default=None, metavar="ID")
    parser.add_argument("--name", default=None)
    args = parser.parse_args()
    if args.steps is None:
        args.steps = 1_000_000 if args.study == "halfcheetah" else 200_000
    result = halfcheetah(args) if args.study == "halfcheetah" else cartpole_grid(args)
    RESULTS.parent.mkdir(exist_ok=True)
    with RESULTS.open("a") as out:
        out.write(json.dumps({**result, "cpu": _cpu_model(), "time": time.time()}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
