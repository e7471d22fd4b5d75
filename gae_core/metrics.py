"""The metric registry: every metric a run logs, with its key, title, unit and how it is drawn.

This module is the one owner of metric keys. The trainer logs under :attr:`Metric.key`, the store
keeps the key as is, the pages, CLI, figures and tests look metrics up here; a key's literal
string appears nowhere else in the package. Keys are namespaced as in CleanRL
(``charts/episodic_return``, ``losses/value_loss``) so one schema serves the store, the charts and
the CSV files.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "ADVANTAGE_MEAN",
    "ADVANTAGE_STD",
    "ENTROPY",
    "EPISODIC_LENGTH",
    "EPISODIC_RETURN",
    "EVAL_RETURN",
    "EXPLAINED_VARIANCE",
    "GRAD_NORM",
    "LEARNING_RATE",
    "LIVE",
    "POLICY_LOSS",
    "REGISTRY",
    "STEPS_PER_SECOND",
    "UPDATE",
    "VALUE_LOSS",
    "WALL_TIME",
    "Metric",
    "get",
]


@dataclass(frozen=True)
class Metric:
    """One logged scalar.

    ``smoothed``: the live charts offer TensorBoard's EMA smoothing for it. ``log_scale``: a log
    y axis is offered (losses spanning decades). ``display_range``: a run's chart of it draws
    values clipped to it and says how many lie outside (never clipped when stored, exported or
    overlaid with other runs), for metrics whose useful range is bounded but whose raw values
    can run off (explained variance goes to −∞ for a bad critic). ``window``: what
    one stored row of a per-update metric holds when a row covers several updates (a run's
    ``log_every``): ``"mean"`` of their values, or the ``"last"`` one (a clock).
    """

    key: str
    title: str
    unit: str
    smoothed: bool = True
    log_scale: bool = False
    display_range: tuple[float, float] | None = None
    short_name: str | None = None
    window: str = "mean"

    @property
    def column(self) -> str:
        """CSV column name of the chart's data: ``charts/episodic_return`` →
        ``episodic_return``; unique across the registry."""
        return self.short_name or self.key.rsplit("/", 1)[-1]

    @property
    def namespace(self) -> str:
        return self.key.split("/", 1)[0]


EPISODIC_RETURN = Metric("charts/episodic_return", "Episodic return", "return (env reward)")
EPISODIC_LENGTH = Metric("charts/episodic_length", "Episode length", "steps")
EVAL_RETURN = Metric(
    "eval/episodic_return",
    "Evaluation return (deterministic policy)",
    "return (env reward)",
    short_name="eval_return",
)
LEARNING_RATE = Metric("charts/learning_rate", "Learning rate", "step size", smoothed=False)
POLICY_LOSS = Metric("losses/policy_loss", "Policy loss", "loss")
VALUE_LOSS = Metric("losses/value_loss", "Value loss", "loss", log_scale=True)
ENTROPY = Metric("losses/entropy", "Entropy", "nats")
EXPLAINED_VARIANCE = Metric(
    "losses/explained_variance",
    "Explained variance",
    "1 − Var[R − V]/Var[R]",
    display_range=(-1.0, 1.0),
)
GRAD_NORM = Metric("losses/grad_norm", "Gradient norm", "L2 norm", log_scale=True)
ADVANTAGE_MEAN = Metric(
    "advantages/mean", "Advantage mean", "advantage", short_name="advantage_mean"
)
ADVANTAGE_STD = Metric(
    "advantages/std", "Advantage std", "advantage", log_scale=True, short_name="advantage_std"
)
APPROX_KL = Metric(
    "losses/approx_kl", "Approximate KL (PPO)", "mean((r − 1) − log r)", log_scale=True
)
CLIP_FRACTION = Metric(
    "losses/clip_fraction", "Clip fraction (PPO)", "share of rows", display_range=(0.0, 1.0)
)
STEPS_PER_SECOND = Metric("perf/steps_per_second", "Env steps per second", "steps/s")
WALL_TIME = Metric("perf/wall_time", "Wall time", "s", smoothed=False, window="last")

REGISTRY: dict[str, Metric] = {
    m.key: m
    for m in (
        EPISODIC_RETURN,
        EPISODIC_LENGTH,
        EVAL_RETURN,
        LEARNING_RATE,
        POLICY_LOSS,
        VALUE_LOSS,
        ENTROPY,
        EXPLAINED_VARIANCE,
        GRAD_NORM,
        ADVANTAGE_MEAN,
        ADVANTAGE_STD,
        APPROX_KL,
        CLIP_FRACTION,
        STEPS_PER_SECOND,
        WALL_TIME,
    )
}

#: What one update reports (the trainer's ``update`` returns these; one that takes no step, for
#: want of a valid row, only its learning rate).
UPDATE: tuple[Metric, ...] = (
    POLICY_LOSS,
    VALUE_LOSS,
    ENTROPY,
    EXPLAINED_VARIANCE,
    ADVANTAGE_MEAN,
    ADVANTAGE_STD,
    GRAD_NORM,
    LEARNING_RATE,
)

#: The live training view's charts, in order (each drawn where the run logged it: the two
#: PPO diagnostics for PPO runs).
LIVE: tuple[Metric, ...] = (
    EPISODIC_RETURN,
    EVAL_RETURN,
    EPISODIC_LENGTH,
    POLICY_LOSS,
    VALUE_LOSS,
    ENTROPY,
    EXPLAINED_VARIANCE,
    APPROX_KL,
    CLIP_FRACTION,
    STEPS_PER_SECOND,
)


def get(key: str) -> Metric:
    """The registered metric, or a plain one titled by its key (metrics of older runs)."""
    found = REGISTRY.get(key)
    if found is not None:
        return found
    name = key.rsplit("/", 1)[-1]
    return Metric(key, name.replace("_", " "), name)
