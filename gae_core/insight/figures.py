"""Plotly figures for the dashboard, built by pure functions.

Each builder returns ``(figure, frame)``: the frame is exactly the data the figure plots, with
column names that say what and in which units, so the page can offer it as CSV unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import sample_colorscale
from plotly.subplots import make_subplots

from gae_core import metrics as M
from gae_core.inert import plotly_text
from gae_core.insight.explorer import gae_column
from gae_core.labels import assignment, label

#: Traces are cut to about this many points so a refresh stays fast however long the run:
#: TensorBoard's default sample of a scalar series. With 2,000 the browser's main thread spent
#: 7.7 s of 9.5 s in long tasks with one run training (8 charts, raw and smoothed traces).
MAX_POINTS = 1000
#: Lines of at most this many points also mark each point: a line through one point (a run
#: evaluated once, at its end) draws nothing, and through a few it hides where they are.
MARKED_POINTS = 30

# SVG traces (go.Scatter), not WebGL (go.Scattergl): with at most MAX_POINTS points SVG draws
# fast, while WebGL falls back to slow software rendering on machines without a GPU and each
# live chart would hold a WebGL context of its own.

X_AXES = {"env_step": "env steps", "wall_time": "wall time (s)"}

#: Distinct colours for overlaid runs (Plotly's qualitative "Dark24" minus near-duplicates).
RUN_COLORS = (
    "#2E91E5", "#E15F99", "#1CA71C", "#FB0D0D", "#DA16FF", "#222A2A", "#B68100", "#750D86",
    "#EB663B", "#511CFB", "#00A08B", "#FB00D1", "#FC0080", "#B2828D", "#6C7C32", "#778AAE",
)  # fmt: skip

_BOUNDARY_STYLE = {
    "terminated": {"color": "#d62728", "dash": "solid"},
    "truncated": {"color": "#ff7f0e", "dash": "dash"},
    "end_of_rollout": {"color": "#7f7f7f", "dash": "dot"},
}


def line_mode(points: int) -> str:
    """A Scatter's mode for a line of ``points`` points (:data:`MARKED_POINTS`)."""
    return "lines+markers" if points <= MARKED_POINTS else "lines"


def downsample_indices(length: int, max_points: int = MAX_POINTS) -> np.ndarray:
    """Indices that keep at most ``max_points`` of ``length`` points, evenly spread and always
    including the first and the last."""
    if length <= max_points:
        return np.arange(length)
    return np.unique(np.linspace(0, length - 1, max_points).round().astype(np.int64))


#: Curves with fewer points are drawn unsmoothed (an average of 4 evaluations ended at 372
#: beside a last point of 500).
MIN_SMOOTHED_POINTS = 20


def smooth(values: np.ndarray, weight: float) -> np.ndarray:
    """TensorBoard's smoothing: a debiased exponential moving average, weight in [0, 1)."""
    if not 0.0 <= weight < 1.0:
        raise ValueError(f"smoothing weight must be in [0, 1), got {weight}")
    values = np.asarray(values, dtype=float)
    out = np.empty_like(values)
    last, debias = 0.0, 1.0
    for i, value in enumerate(values):
        last = last * weight + (1.0 - weight) * value
        debias *= weight
        out[i] = last / (1.0 - debias) if weight else value
    return out


def metric_frame(
    metrics: pd.DataFrame, key: str, *, smoothing: float = 0.0, every_point: bool = False
) -> pd.DataFrame:
    """One metric of one run from the store's long frame (``env_step, wall_time, key, value``):
    ``env_step``, ``wall_time_s``, the value column and, with smoothing, ``<name>_smoothed``
    (computed on every point; not for a curve of fewer than :data:`MIN_SMOOTHED_POINTS`, such
    as a handful of evaluations, which a moving average would only drag). Downsampled to
    :data:`MAX_POINTS` for drawing unless ``every_point`` (the CSV exports: every logged
    point)."""
    name = M.get(key).column
    rows = metrics[metrics["key"] == key].sort_values(["env_step", "wall_time"], kind="stable")
    frame = pd.DataFrame(
        {
            "env_step": rows["env_step"].to_numpy(),
            "wall_time_s": rows["wall_time"].to_numpy(),
            name: rows["value"].to_numpy(),
        }
    )
    if smoothing > 0 and len(frame) >= MIN_SMOOTHED_POINTS:
        frame[f"{name}_smoothed"] = smooth(frame[name].to_numpy(), smoothing)
    if every_point:
        return frame
    return frame.iloc[downsample_indices(len(frame))].reset_index(drop=True)


def y_range(values: np.ndarray, display_range: tuple[float, float] | None) -> list[float] | None:
    """A y-axis range that never degenerates (all values equal: ±max(1, 10 %) around them) and
    stays within the metric's display range; None lets Plotly choose."""
    finite = np.asarray(values, float)
    finite = finite[np.isfinite(finite)]
    if not len(finite):
        return None
    low, high = float(finite.min()), float(finite.max())
    if display_range is None and high > low:
        return None
    if high == low:
        pad = max(1.0, 0.1 * abs(low))
        low, high = low - pad, high + pad
    else:
        pad = 0.05 * (high - low)
        low, high = low - pad, high + pad
    if display_range is not None:
        low, high = max(low, display_range[0]), min(high, display_range[1])
        if high <= low:  # every value outside the display range: show the range itself
            low, high = display_range
    return [low, high]


def metric_figure(
    metrics: pd.DataFrame,
    key: str,
    *,
    x: str = "env_step",
    smoothing: float = 0.0,
    log_y: bool = False,
) -> tuple[go.Figure, pd.DataFrame]:
    """A run's metric against env steps or wall time: raw points, plus TensorBoard's smoothed
    line when ``smoothing`` > 0. The figure draws at most :data:`MAX_POINTS`; the frame holds
    every logged point (the CSV). ``log_y`` (offered for metrics spanning decades) uses a log
    axis; a metric with a display range (explained variance) is drawn within it."""
    if x not in X_AXES:
        raise ValueError(f"x must be one of {sorted(X_AXES)}, got {x!r}")
    full = metric_frame(metrics, key, smoothing=smoothing, every_point=True)
    frame = full.iloc[downsample_indices(len(full))]
    metric = M.get(key)
    name = metric.column
    x_column = "env_step" if x == "env_step" else "wall_time_s"
    figure = go.Figure()
    smoothed = f"{name}_smoothed" in frame
    if smoothed:  # the raw line faint, the smoothed line on top (TensorBoard's look)
        # A line is one SVG path; markers are one node per point, and a page of live charts
        # with 2,000 markers each kept the browser's main thread busy for seconds per refresh.
        figure.add_trace(
            go.Scatter(
                x=frame[x_column],
                y=frame[name],
                mode=line_mode(len(frame)),
                name=name,
                line={"color": "#9ecae1", "width": 1},
                opacity=0.7,
            )
        )
        figure.add_trace(
            go.Scatter(
                x=frame[x_column],
                y=frame[f"{name}_smoothed"],
                mode=line_mode(len(frame)),
                name=f"{name} (smoothed)",
                line={"color": "#08519c", "width": 2},
            )
        )
    else:
        figure.add_trace(
            go.Scatter(
                x=frame[x_column],
                y=frame[name],
                mode=line_mode(len(frame)),
                name=name,
                line={"color": "#08519c", "width": 1.5},
            )
        )
    _layout(figure, metric.title, X_AXES[x], metric.unit)
    steps = frame[x_column].unique()
    if len(steps) == 1 and steps[0] > 0:  # one point: from 0 to it, not ±0.5 env steps around
        figure.update_xaxes(range=[0, 1.05 * float(steps[0])])
    if log_y:
        figure.update_yaxes(type="log")
    else:
        figure.update_yaxes(range=y_range(frame[name].to_numpy(), metric.display_range))
    return figure, full


def overlay_figure(
    runs: Mapping[str, pd.DataFrame], key: str, *, x: str = "env_step", smoothing: float = 0.0
) -> tuple[go.Figure, pd.DataFrame]:
    """One metric of several runs on one chart, each run its own colour; the frame is long with
    a ``run`` column and every logged point."""
    if x not in X_AXES:
        raise ValueError(f"x must be one of {sorted(X_AXES)}, got {x!r}")
    metric = M.get(key)
    name = metric.column
    x_column = "env_step" if x == "env_step" else "wall_time_s"
    figure, parts = go.Figure(), []
    for i, (run_name, metrics) in enumerate(runs.items()):
        frame = metric_frame(metrics, key, smoothing=smoothing, every_point=True)
        smoothed = f"{name}_smoothed"
        value_column = smoothed if smoothed in frame else name  # few points: unsmoothed
        frame.insert(0, "run", run_name)
        parts.append(frame)
        drawn = frame.iloc[downsample_indices(len(frame))]
        figure.add_trace(
            go.Scatter(
                x=drawn[x_column],
                y=drawn[value_column],
                mode=line_mode(len(drawn)),
                name=plotly_text(run_name),
                line={"color": RUN_COLORS[i % len(RUN_COLORS)]},  # distinct, in order
            )
        )
    _layout(figure, metric.title, X_AXES[x], metric.unit)
    frame = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    return figure, frame


# ----------------------------------------------------------------------------- explorer


def estimator_color(column: str) -> str:
    """A line's colour as a function of what it is, so a λ or a k keeps its colour whatever
    else is pinned: δ black, V grey, Â^(k) purples by log k, GAE(λ) viridis by λ (no red: red
    marks terminations)."""
    if column == "delta":
        return "#000000"
    if column == "value":
        return "#7f7f7f"
    if column.startswith("k_step[k="):
        k = int(column[9:-1])
        position = min(1.0, 0.35 + 0.65 * np.log2(k) / 9.0)  # k = 1 … 512
        return sample_colorscale("Purples", [position])[0]
    if column.startswith("gae[lambda="):
        return sample_colorscale("Viridis", [0.9 * float(column[11:-1])])[0]
    return "#1f77b4"


def explorer_figure(
    table: pd.DataFrame,
    *,
    show: Sequence[str] | None = None,
    gamma: float | None = None,
    lambda_: float | None = None,
) -> tuple[go.Figure, pd.DataFrame]:
    """Per-step plot of an :func:`~gae_core.insight.explorer.advantage_table` in two panels
    sharing the step axis: on top V(s_t) with the rewards as bars (own axis), below δ_t, each
    Â^(k) and each GAE(λ) (advantages have their own scale, not V's). Episode boundaries are
    vertical lines across both: terminated solid red, truncated dashed orange, end of rollout
    dotted grey. GAE at the slider's ``lambda_`` is drawn solid and widest, other (pinned) λ
    long-dashed. The frame (the CSV) carries γ and the slider's λ with every row."""
    estimate_columns = [
        c for c in table.columns if c.startswith(("k_step[", "gae[")) or c == "delta"
    ]
    columns = [c for c in (show if show is not None else estimate_columns) if c != "value"]
    figure = make_subplots(
        rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.06, row_heights=[0.35, 0.65],
        specs=[[{"secondary_y": True}], [{}]],
        subplot_titles=["V(s_t) and rewards", "advantage estimates"],
    )  # fmt: skip
    figure.add_trace(
        go.Bar(x=table["t"], y=table["reward"], name="reward r_t (right axis)", opacity=0.3,
               marker_color="#7f7f7f"),
        row=1, col=1, secondary_y=True,
    )  # fmt: skip
    figure.add_trace(
        go.Scatter(x=table["t"], y=table["value"], mode="lines", name=_pretty("value"),
                   line={"color": estimator_color("value"), "width": 2}),
        row=1, col=1,
    )  # fmt: skip
    slider = None if lambda_ is None else gae_column(lambda_)
    for column in columns:
        # the slider's λ solid and widest; pinned λ long-dashed: near λ their viridis colours
        # are alike (0.95 and 1), the line style tells them apart
        dash = "dot" if column.startswith("k_step[") else None
        width = 1.5
        if column.startswith("gae["):
            dash, width = (None, 3.5) if column == slider else ("longdash", 2)
        figure.add_trace(
            go.Scatter(x=table["t"], y=table[column], mode="lines", name=_pretty(column),
                       line={"dash": dash, "width": width, "color": estimator_color(column)}),
            row=2, col=1,
        )  # fmt: skip
    for flag, style in _BOUNDARY_STYLE.items():
        for t in table.loc[table[flag].astype(bool), "t"]:
            figure.add_vline(x=float(t) + 0.5, line={**style, "width": 1.5}, opacity=0.7,
                             row="all", col=1)  # fmt: skip
        # an invisible trace so the legend explains the line style
        figure.add_trace(
            go.Scatter(x=[None], y=[None], mode="lines", name=flag.replace("_", " "),
                       line={**style, "width": 1.5}),
            row=2, col=1,
        )  # fmt: skip
    _layout(figure, "Advantage estimates along the trajectory", "step t", "value")
    figure.update_yaxes(title_text="V(s_t)", row=1, col=1, secondary_y=False)
    figure.update_yaxes(title_text="reward", row=1, col=1, secondary_y=True, showgrid=False)
    figure.update_yaxes(title_text="advantage", row=2, col=1)
    figure.update_layout(height=520, xaxis_title=None)
    figure.update_xaxes(title_text="step t", row=2, col=1)
    keep = ["t", "reward", "value", "next_value", "terminated", "truncated", "end_of_rollout"]
    frame = table[list(dict.fromkeys([*keep, "delta", *columns]))].copy()
    if gamma is not None:
        frame.insert(1, "gamma", gamma)
    if lambda_ is not None:
        frame.insert(2 if gamma is not None else 1, "lambda_", lambda_)
    return figure, frame


def heatmap_figure(
    heat: pd.DataFrame, current: float | None = None
) -> tuple[go.Figure, pd.DataFrame]:
    """GAE over (t, λ) from :func:`~gae_core.insight.explorer.gae_heatmap`; a dashed line marks
    the slider's λ."""
    grid = heat.pivot(index="lambda_", columns="t", values="gae")
    limit = float(np.nanmax(np.abs(grid.to_numpy()))) if grid.size else 1.0
    figure = go.Figure(
        go.Heatmap(
            z=grid.to_numpy(),
            x=grid.columns,
            y=grid.index,
            colorscale="RdBu",
            zmid=0.0,
            zmin=-limit,
            zmax=limit,
            colorbar={"title": "GAE"},
        )
    )
    if current is not None:
        figure.add_hline(
            y=current,
            line={"color": "#000000", "dash": "dash", "width": 1.5},
            annotation_text=assignment("lambda_", current),
            annotation_position="top left",
        )
    lam = label("lambda_")
    _layout(figure, f"GAE({label('gamma')}, {lam}) over steps and {lam}", "step t", lam)
    return figure, heat


def weights_figure(weights: pd.DataFrame, lambda_: float) -> tuple[go.Figure, pd.DataFrame]:
    """Bars of each Â^(k)'s weight in GAE, the tail mass on the last one highlighted, with the
    infinite-horizon geometric weights (1−λ)λ^(k−1) as a line."""
    colors = np.where(weights["tail"], "#d62728", "#1f77b4")
    lam = label("lambda_")
    figure = go.Figure()
    figure.add_trace(
        go.Bar(
            x=weights["k"],
            y=weights["weight"],
            marker_color=colors,
            name="weight in GAE (tail in red)",
        )
    )
    figure.add_trace(
        go.Scatter(
            x=weights["k"],
            y=weights["geometric_weight"],
            mode="lines",
            name=f"(1−{lam}){lam}^(k−1)",
            line={"dash": "dot"},
        )
    )
    title = f"Weight of each k-step estimator at {assignment('lambda_', lambda_)}"
    _layout(figure, title, "k", "weight")
    return figure, weights


def _pretty(column: str) -> str:
    if column == "delta":
        return "δ_t"
    if column == "value":
        return "V(s_t)"
    if column.startswith("k_step[k="):
        return f"Â^({column[9:-1]})"
    if column.startswith("gae[lambda="):
        return f"GAE {assignment('lambda_', float(column[11:-1]))}"
    return column


def _layout(figure: go.Figure, title: str, x_label: str, y_label: str) -> None:
    figure.update_layout(
        title=title,
        xaxis_title=x_label,
        yaxis_title=y_label,
        margin={"l": 40, "r": 10, "t": 40, "b": 40},
        height=340,
        legend={"orientation": "h", "y": -0.25},
        uirevision="keep",  # keep zoom and legend state across live refreshes
    )


__all__ = [
    "MAX_POINTS",
    "X_AXES",
    "downsample_indices",
    "explorer_figure",
    "heatmap_figure",
    "metric_figure",
    "metric_frame",
    "overlay_figure",
    "smooth",
    "weights_figure",
]
