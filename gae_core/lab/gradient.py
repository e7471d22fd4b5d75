r"""The gradient lens: what λ does to the policy-gradient estimate itself, not only to each
state's advantage (Ilyas et al., "A Closer Look at Deep Policy Gradients", 2020, measured batch
gradients against a "true" one; here per λ, with intervals).

For a policy checkpoint π_θ and a critic V̂:

* **The batch estimator.** A batch is what training computes one update from: ``envs`` env
  copies stepped ``steps`` times with π (time limits reset a copy, as in training), GAE(γ, λ)
  (or Â^(k)) with V̂ bootstrapping at a truncation and at the window's end, and

  .. math::  ĝ_λ = \frac{1}{n} \sum_i ∇_θ \log π_θ(a_i|s_i)\, Â^λ_i

  over its n samples (the policy-gradient term of the loss, unnormalised advantages). K
  independent batches start at independent, uniformly spread points of the env's episode stream
  (a burn-in of one time limit, then a random offset up to another).
* **The reference.** g* is the same average over ≥ ``reference`` samples from whole episodes
  (each step of an episode up to the time limit counts once: the stream's state distribution),
  with Monte-Carlo advantages G_t − V(s_t), G_t the discounted return followed past the time
  limit until γ^H ≤ 10⁻³ (time limits are not part of the state, as the lab's truth), and V the
  policy checkpoint's own critic as the baseline (any baseline leaves g* unbiased; the best one
  available keeps it least noisy). Its noise ``reference_noise`` = tr Cov(ĝ*) is estimated
  from 32 blocks of episodes; where its standard error is not small against ‖g*‖ the result
  says so (:meth:`GradientResult.reference_note`): then bias² cannot be read. Besides a
  window's end, the batches bootstrap V̂ at every time-limit truncation where g* follows the
  real return past it, so part of what is measured as bias is the critic's error at those
  states (on CartPole and HalfCheetah every good episode truncates); and with gSDE the batches
  draw fresh noise every step (as the lab does), not one matrix per rollout as training does.
* **Per-sample scores once.** ψ_i = ∇_θ log π(a_i|s_i) for every sample of a batch come from
  one ``torch.func.vmap(grad(…))``; every estimator's gradient is then one product
  ``G = Aᵀ Ψ / n`` with the advantages of all λ (:func:`gae_core.estimators.gae_lambda_sweep`),
  so 101 λ cost about one.
* **Statistics over batches** (:func:`gradient_statistics`), each with a percentile-bootstrap
  interval over batches: the mean cosine of ĝ_λ to g*; the mean pairwise cosine between
  independent batches (needs no g*); variance = tr Cov(ĝ_λ) (ddof 1);
  bias² = ‖mean ĝ_λ − g*‖² − variance/K − reference_noise (both means' noise subtracted: an
  unbiased estimate, which can fall below 0); MSE = bias² + variance = E‖ĝ_λ − g*‖²; and the
  signal-to-noise ratio SNR = ‖E ĝ_λ‖² / tr Cov(ĝ_λ), with ‖E ĝ‖² estimated unbiasedly as
  ‖mean ĝ‖² − variance/K.

* **How much one batch weighs** (:func:`largest_batch_share`): per estimator, the largest
  share of the batches' spread one batch holds, max_k ‖ĝ_k − ḡ‖² / Σ_l ‖ĝ_l − ḡ‖². Where it
  passes :func:`heavy_share` (Grubbs' bound for one normal coordinate at level 10⁻³: the
  share one batch of K light-tailed batches passes once in 1,000 measurements, whatever the
  gradients' dimension), a rare large advantage (a termination's TD error) landed in that
  batch, and the variance, MSE and their intervals rest on it (:meth:`GradientResult.tail_note`).

All of these are functions of the K × K Gram matrices of the batch gradients (and of their
differences from g*), so a bootstrap resample is a quadratic form in its counts and never
copies a gradient. Gradients are in env reward units (raw rewards, V̂ scaled back); the
parameters are the actor's (and its log-std).
"""

from __future__ import annotations

import math
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from gae_core.agent.envs import episode_cap, make_eval_env
from gae_core.agent.recording import Replay
from gae_core.lab.gradient_samples import (
    BATCH_SAMPLE_COST,
    WINDOW_STEP_COST,
    action_tensor,
    actor_parameters,
    batch_gradients,
    per_sample_scores,
    reference_gradient,
    sample_windows,
    window_advantages,
)
from gae_core.lab.rollouts import Progress
from gae_core.lab.settings import GradientSettings
from gae_core.labels import assignment, label

__all__ = [
    "DEBIASED_NOTE",
    "GradientResult",
    "actor_parameters",
    "batch_gradients",
    "batch_problem",
    "gradient_statistics",
    "heavy_share",
    "largest_batch_share",
    "measure_gradient",
    "per_sample_scores",
]

#: The quantities measured per estimator, in the order tables and JSON give them.
QUANTITIES = ("cosine", "pairwise_cosine", "bias2", "variance", "mse", "snr")
#: Why bias² and the SNR can read below 0 (the page's caption and the CLI say it).
DEBIASED_NOTE = (
    "the reference's noise and the batches' are subtracted from bias², and the batches' from "
    "the SNR's signal ‖E ĝ‖², so both can dip below 0 where they are small"
)


def batch_problem(size: int, envs: int) -> str | None:
    """Why ``size`` samples cannot be a gradient batch of a run with ``envs`` envs (a batch is
    whole vector steps of the run's env), or None when it can."""
    if size % envs:
        return f"batch size must be a multiple of the run's num_envs ({envs}), got {size:,}"
    return None


# ----------------------------------------------------------------------------- statistics


def gradient_statistics(
    gradients: np.ndarray,
    reference: np.ndarray,
    reference_noise: float = 0.0,
    *,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per estimator, ``(point, ci_low, ci_high)`` of each of :data:`QUANTITIES` (module
    docstring) from ``gradients [K, E, P]`` (K batches, E estimators), the reference g* ``[P]``
    and its noise tr Cov(ĝ*); percentile-bootstrap intervals over the K batches."""
    G = np.asarray(gradients, np.float64)
    if G.ndim != 3:
        raise ValueError(f"gradients must be [batches, estimators, parameters], got {G.shape}")
    K = G.shape[0]
    if K < 2:
        raise ValueError(f"batches must be ≥ 2 (a variance needs two), got {K}")
    g = np.asarray(reference, np.float64)
    X = np.moveaxis(G, 1, 0)  # [E, K, P]
    H = X @ X.transpose(0, 2, 1)  # Gram of the batch gradients
    diff = X - g
    D = diff @ diff.transpose(0, 2, 1)  # Gram of their differences from g*
    norms = np.sqrt(np.einsum("ekk->ek", H))
    with np.errstate(divide="ignore", invalid="ignore"):
        to_reference = (X @ g) / (norms * np.linalg.norm(g))  # [E, K]
        pairwise = H / (norms[:, :, None] * norms[:, None, :])
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(K, np.full(K, 1.0 / K), size=resamples).astype(np.float64)
    W = np.vstack([np.ones(K), counts])  # row 0: the point estimate

    # Every quantity is a mean over pairs of *distinct* batches (a U-statistic): ‖E ĝ − g*‖² is
    # estimated without bias by the mean of ⟨ĝ_k − g*, ĝ_l − g*⟩ over k ≠ l, which equals
    # ‖ḡ − g*‖² − tr S/K. A resample weighs pair (k, l) by c_k c_l and leaves out a batch
    # paired with itself (drawn twice or not), so its bootstrap mean is the point estimate; the
    # plug-in ‖ḡ_c − g*‖² − v_c/K would sit tr S/K above it in every resample.
    own = np.sum(W**2, axis=1)  # Σ c_k²: the weight of same-batch pairs
    pairs = K**2 - own  # [B]: the weight of distinct pairs (0 when one batch was drawn K times)

    def pair_mean(M: np.ndarray) -> np.ndarray:  # [E, B]: mean of M_kl over distinct pairs
        quadratic = np.einsum("bk,ekl,bl->eb", W, M, W, optimize=True)
        diagonal = np.einsum("bk,ek->eb", W**2, np.einsum("ekk->ek", M))
        return (quadratic - diagonal) / pairs

    diag_h = np.einsum("ekk->ek", H)
    with np.errstate(divide="ignore", invalid="ignore"):
        signal = pair_mean(H)  # ‖E ĝ‖²
        # tr Cov = mean over distinct pairs of ½‖ĝ_k − ĝ_l‖² = ½(H_kk + H_ll) − H_kl
        spread = np.einsum("bk,ek->eb", W * (K - W), diag_h) / pairs
        variance = spread - signal
        bias2 = pair_mean(D) - reference_noise
        values = {
            "cosine": np.einsum("bk,ek->eb", W, to_reference) / K,
            "pairwise_cosine": pair_mean(pairwise),
            "bias2": bias2,
            "variance": variance,
            "mse": bias2 + variance,
            "snr": signal / variance,
        }
    alpha = (1.0 - confidence) / 2.0
    out = {}
    for name, v in values.items():
        v = np.where(np.isfinite(v), v, np.nan)
        with warnings.catch_warnings():  # a quantity undefined in every resample stays NaN
            warnings.simplefilter("ignore", RuntimeWarning)
            low, high = np.nanquantile(v[:, 1:], [alpha, 1.0 - alpha], axis=1)
        out[name] = (v[:, 0], low, high)
    return out


def largest_batch_share(gradients: np.ndarray) -> np.ndarray:
    """Per estimator, max_k ‖ĝ_k − ḡ‖² / Σ_l ‖ĝ_l − ḡ‖² of ``gradients [K, E, P]`` (module
    docstring): the largest share of the batches' spread around their mean that one batch
    holds; NaN where the batches do not spread. One estimator at a time (a copy of all the
    gradients would be as large as they are)."""
    G = np.asarray(gradients, np.float64)
    shares = np.full(G.shape[1], np.nan)
    for e in range(G.shape[1]):
        spread = np.sum((G[:, e] - G[:, e].mean(axis=0)) ** 2, axis=1)  # [K]
        if spread.sum() > 0:
            shares[e] = spread.max() / spread.sum()
    return shares


#: How rarely light-tailed batches pass :func:`heavy_share` (per estimator).
HEAVY_LEVEL = 1e-3


def heavy_share(batches: int, level: float = HEAVY_LEVEL) -> float:
    """The share of the batches' spread one of ``batches`` (K ≥ 3) i.i.d. normal values passes
    with probability at most ``level``: Grubbs' critical value G² / (K − 1) =
    (K − 1)/K · t² / (K − 2 + t²), t the t distribution's 1 − level/(2K) quantile with K − 2
    degrees of freedom. One coordinate is the worst case: in more dimensions the spread is
    shared out more evenly, so this bound holds for gradients of any size."""
    K = batches
    if K < 3:
        raise ValueError(f"batches must be ≥ 3 for a largest share to mean anything, got {K}")
    t2 = scipy_stats.t.ppf(1.0 - level / (2 * K), K - 2) ** 2
    return float((K - 1) / K * t2 / (K - 2 + t2))


# ----------------------------------------------------------------------------- the result


@dataclass(frozen=True)
class GradientResult:
    """What the lens measured: ``table`` has one row per critic and estimator (``critic``,
    ``kind`` gae/k_step, ``param``, every quantity with ``_ci_low``/``_ci_high``, and
    ``largest_batch_share``, absent from measurements stored before it was kept);
    ``reference`` its samples, noise and norm; ``meta`` the run, policy and critic steps."""

    env_id: str
    settings: GradientSettings
    table: pd.DataFrame
    reference: dict[str, float]
    batch: dict[str, int]
    seconds: float
    meta: dict[str, Any] = field(default_factory=dict)

    def reference_note(self) -> str | None:
        """A warning when the reference is too noisy to measure bias against (its standard
        error above a third of its norm), else None."""
        se, norm = self.reference["standard_error"], self.reference["norm"]
        if se <= norm / 3:
            return None
        return (
            f"The reference gradient is noisy: its standard error {se:.3g} is "
            f"{se / max(norm, 1e-300):.2g}× its norm {norm:.3g}, so bias², MSE and the cosine "
            "to g* mostly measure the reference's own noise (bias² can come out below 0). Raise "
            "the reference's samples; the pairwise cosine and the variance do not need g*."
        )

    def tail_note(self) -> str | None:
        """A warning where one batch holds more of some estimator's spread than light-tailed
        batches would once in 1,000 (:func:`heavy_share`), else None (and for K < 3, or a
        measurement stored before the share was kept)."""
        K = self.settings.batches
        if "largest_batch_share" not in self.table or K < 3:
            return None
        bound = heavy_share(K)
        heavy = self.table[self.table["largest_batch_share"] > bound]
        if heavy.empty:
            return None
        top = heavy.loc[heavy["largest_batch_share"].idxmax()]
        where = (assignment("lambda_", top["param"]) if top["kind"] == "gae"
                 else f"Â^({int(top['param'])})")  # fmt: skip
        rows = "estimators" if self.table["critic"].nunique() == 1 else "critic × estimator rows"
        return (
            f"Heavy tails: in {len(heavy)} of the {len(self.table)} {rows} one of the {K} "
            f"batches holds {top['largest_batch_share']:.0%} of the batches' spread at most (at "
            f"{where}, {top['critic']}), where light-tailed batches pass {bound:.0%} once in "
            f"{1 / HEAVY_LEVEL:,.0f}. A rare large advantage (a termination's TD error, say) "
            "landed in few batches, so the variance, MSE and their intervals rest on those "
            "batches and can move many-fold with more: measure with more batches before "
            f"reading a trend over {label('lambda_')} from them."
        )

    def best_lambda(self, critic: str | None = None) -> float:
        """The λ whose gradient has the least MSE against g* (for ``critic``, else the first)."""
        rows = self.table[self.table["kind"] == "gae"]
        rows = rows[rows["critic"] == (critic or rows["critic"].iloc[0])]
        return float(rows.loc[rows["mse"].idxmin(), "param"])

    def to_json(self) -> dict[str, Any]:
        settings = asdict(self.settings)
        settings["lambdas"], settings["ks"] = list(settings["lambdas"]), list(settings["ks"])
        return {"kind": "gradient", "env_id": self.env_id, "settings": settings,
                "table": self.table.to_dict("list"), "reference": self.reference,
                "batch": self.batch, "seconds": self.seconds, "meta": self.meta}  # fmt: skip

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GradientResult:
        settings = dict(data["settings"])
        settings["lambdas"], settings["ks"] = tuple(settings["lambdas"]), tuple(settings["ks"])
        table = pd.DataFrame(data["table"])
        return cls(data["env_id"], GradientSettings(**settings), table, data["reference"],
                   data["batch"], data["seconds"], data.get("meta", {}))  # fmt: skip


def measure_gradient(
    env_id: str,
    policy: Replay,
    critics: Sequence[Replay],
    settings: GradientSettings,
    *,
    envs: int,
    steps: int,
    critic_names: Sequence[str] | None = None,
    progress: Callable[[float], None] | None = None,
    cancel: threading.Event | None = None,
) -> GradientResult:
    """The lens for ``policy`` with each of ``critics``: K batches of ``envs × steps`` samples,
    the reference, and :func:`gradient_statistics` per critic and estimator. Raises
    :class:`~gae_core.lab.rollouts.LabCancelled` when ``cancel`` is set."""
    began = time.perf_counter()
    names = list(critic_names or [f"critic {i}" for i in range(len(critics))])
    K = settings.batches
    probe = make_eval_env(env_id)
    cap = episode_cap(probe)
    probe.close()
    # progress, each part by its cost (gradient_samples.WINDOW_STEP_COST): the windows' env
    # steps (at most two time limits and the window per copy), each batch's samples per
    # critic, then the reference's samples
    ticker = Progress(
        envs * K * ((2 * cap + steps) * WINDOW_STEP_COST + steps * len(critics) * BATCH_SAMPLE_COST)
        + settings.reference,
        progress, cancel,
    )  # fmt: skip
    windows = sample_windows(env_id, policy, K, envs, steps, settings.seed, ticker)
    # each batch's scores are used for every critic at once and then dropped: K batches of
    # [n, P] scores held together would be most of the memory
    gradients = np.zeros((len(critics), K, len(settings.estimators()), 0))
    for k in range(K):
        keep = windows.valid[k]
        o = policy.policy_input(windows.obs[k][keep])
        scores = per_sample_scores(policy.model, o, action_tensor(windows.actions[k][keep]))
        each = [
            batch_gradients(scores, window_advantages(windows, c, k, settings)) for c in critics
        ]
        if not gradients.size:
            gradients = np.zeros((len(critics), K, *each[0].shape))
        gradients[:, k] = each
        ticker.step(envs * steps * len(critics) * BATCH_SAMPLE_COST)  # (and any cancel)
    g_star, noise, samples = reference_gradient(env_id, policy, policy, settings, ticker)
    frames = []
    for name, G in zip(names, gradients, strict=True):
        stats = gradient_statistics(G, g_star, noise, confidence=settings.confidence,
                                    resamples=settings.resamples, seed=settings.seed)  # fmt: skip
        kinds = settings.estimators()
        frame = pd.DataFrame({"critic": name, "kind": [k for k, _ in kinds],
                              "param": [p for _, p in kinds]})  # fmt: skip
        for quantity in QUANTITIES:
            point, low, high = stats[quantity]
            frame[quantity], frame[f"{quantity}_ci_low"], frame[f"{quantity}_ci_high"] = (
                point, low, high)  # fmt: skip
        frame["largest_batch_share"] = largest_batch_share(G)
        frames.append(frame)
    ticker.step(max(0.0, ticker.total - ticker.done))  # done (the windows' bound was loose)
    n = int(windows.valid.sum() / K)
    return GradientResult(
        env_id=env_id,
        settings=settings,
        table=pd.concat(frames, ignore_index=True),
        reference={
            "samples": samples,
            "noise": noise,
            "standard_error": math.sqrt(noise),
            "norm": float(np.linalg.norm(g_star)),
        },
        batch={"envs": envs, "steps": steps, "samples": n},
        seconds=time.perf_counter() - began,
    )


def gradient_sentence(table: pd.DataFrame, critic: str) -> str:
    """Which λ gives ``critic``'s most reliable gradient (least MSE against g*), how sure that
    is (the λ whose MSE interval overlaps the best one's), and its cosine to g*; where that
    cosine is ≤ 0 (a short gradient pointing the wrong way), that it points away from g* and
    which λ's gradient is best aligned with it."""
    rows = table[(table["kind"] == "gae") & (table["critic"] == critic)].sort_values("param")
    best = rows.loc[rows["mse"].idxmin()]
    tied = rows[(rows["mse_ci_low"] <= best["mse_ci_high"])
                & (rows["mse_ci_high"] >= best["mse_ci_low"])]["param"]  # fmt: skip
    lam = label("lambda_")
    span = (f"{lam} from {tied.min():g} to {tied.max():g} cannot be told apart from it"
            if len(tied) > 1 else f"no other {lam}'s interval overlaps it")  # fmt: skip
    text = (
        f"{critic}: the least gradient MSE is at {assignment('lambda_', best['param'])} "
        f"(MSE {best['mse']:.4g} [{best['mse_ci_low']:.4g}, {best['mse_ci_high']:.4g}], cosine "
        f"to g* {_signed(best['cosine'])}); {span} at this number of batches"
    )
    if best["cosine"] <= 0:  # a short gradient that points the wrong way can have the least MSE
        aligned = rows.loc[rows["cosine"].idxmax()]
        text += (
            f". Its gradient points away from g* (cosine ≤ 0): a short gradient has a small "
            f"MSE whatever its direction, so read the cosine here; the highest is at "
            f"{assignment('lambda_', aligned['param'])} ({_signed(aligned['cosine'])})"
        )
    return text


def _signed(value: float) -> str:
    """A cosine as the page writes numbers: three decimals, a typographic minus."""
    return f"{value:.3f}".replace("-", "−")
