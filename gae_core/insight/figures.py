"""Plotly figures for the dashboard, built by pure functions.

Each builder returns ``(figure, frame)``: the frame is exactly the data the figure plots, with
column names that say what and in which units, so the page can offer it as CSV unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from gae_core import metrics as M
from gae_core.inert import plotly_text
from gae_core.labels import group_label, label

#: Traces are cut to about this many points so a refresh stays fast however long the run.
MAX_POINTS = 2000

# SVG traces (go.Scatter), not WebGL (go.Scattergl): with at most MAX_POINTS points SVG draws
# fast, while WebGL falls back to slow software rendering on machines without a GPU and each
# live chart would hold a WebGL context of its own.

X_AXES = {"env_step": "env steps", "wall_time": "wall time (s)"}

_BOUNDARY_STYLE = {
    "terminated": {"color": "#d62728", "dash": "solid"},
    "truncated": {"color": "#ff7f0e", "dash": "dash"},
    "end_of_rollout": {"color": "#7f7f7f", "dash": "dot"},
}


def downsample_indices(length: int, max_points: int = MAX_POINTS) -> np.ndarray:
    """Indices that keep at most ``max_points`` of ``length`` points, evenly spread and always
    including the first and the last."""
    if length <= max_points:
        return np.arange(length)
    return np.unique(np.linspace(0, length - 1, max_points).round().astype(np.int64))


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


def metric_frame(metrics: pd.DataFrame, key: str, *, smoothing: float = 0.0) -> pd.DataFrame:
    """One metric of one run from the store's long frame (``env_step, wall_time, key, value``):
    ``env_step``, ``wall_time_s``, the value column and, with smoothing, ``<name>_smoothed``
    (computed on every point, then downsampled to :data:`MAX_POINTS`)."""
    name = M.get(key).column
    rows = metrics[metrics["key"] == key].sort_values(["env_step", "wall_time"], kind="stable")
    frame = pd.DataFrame(
        {
            "env_step": rows["env_step"].to_numpy(),
            "wall_time_s": rows["wall_time"].to_numpy(),
            name: rows["value"].to_numpy(),
        }
    )
    if smoothing > 0:
        frame[f"{name}_smoothed"] = smooth(frame[name].to_numpy(), smoothing)
    return frame.iloc[downsample_indices(len(frame))].reset_index(drop=True)


def metric_figure(
    metrics: pd.DataFrame, key: str, *, x: str = "env_step", smoothing: float = 0.0
) -> tuple[go.Figure, pd.DataFrame]:
    """A run's metric against env steps or wall time: raw points, plus the smoothed line."""
    if x not in X_AXES:
        raise ValueError(f"x must be one of {sorted(X_AXES)}, got {x!r}")
    frame = metric_frame(metrics, key, smoothing=smoothing)
    metric = M.get(key)
    name = metric.column
    x_column = "env_step" if x == "env_step" else "wall_time_s"
    title, y_label = metric.title, metric.unit
    figure = go.Figure()
    smoothed = f"{name}_smoothed" in frame
    if smoothed:  # raw points faint, the smoothed line on top (TensorBoard's look)
        figure.add_trace(
            go.Scatter(
                x=frame[x_column],
                y=frame[name],
                mode="markers",
                name=name,
                marker={"size": 4, "color": "#9ecae1", "opacity": 0.6},
            )
        )
        figure.add_trace(
            go.Scatter(
                x=frame[x_column],
                y=frame[f"{name}_smoothed"],
                mode="lines",
                name=f"{name} (smoothed)",
                line={"color": "#08519c", "width": 2},
            )
        )
    else:
        figure.add_trace(
            go.Scatter(
                x=frame[x_column],
                y=frame[name],
                mode="lines",
                name=name,
                line={"color": "#08519c", "width": 1.5},
            )
        )
    _layout(figure, title, X_AXES[x], y_label)
    return figure, frame


def overlay_figure(
    runs: Mapping[str, pd.DataFrame], key: str, *, x: str = "env_step", smoothing: float = 0.0
) -> tuple[go.Figure, pd.DataFrame]:
    """One metric of several runs on one chart; the frame is long with a ``run`` column."""
    if x not in X_AXES:
        raise ValueError(f"x must be one of {sorted(X_AXES)}, got {x!r}")
    metric = M.get(key)
    name = metric.column
    x_column = "env_step" if x == "env_step" else "wall_time_s"
    value_column = f"{name}_smoothed" if smoothing > 0 else name
    figure, parts = go.Figure(), []
    for run_name, metrics in runs.items():
        frame = metric_frame(metrics, key, smoothing=smoothing)
        frame.insert(0, "run", run_name)
        parts.append(frame)
        figure.add_trace(
            go.Scatter(
                x=frame[x_column], y=frame[value_column], mode="lines", name=plotly_text(run_name)
            )
        )
    _layout(figure, metric.title, X_AXES[x], metric.unit)
    frame = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    return figure, frame


# ----------------------------------------------------------------------------- explorer


def explorer_figure(
    table: pd.DataFrame, *, show: Sequence[str] | None = None
) -> tuple[go.Figure, pd.DataFrame]:
    """Per-step plot of an :func:`~gae_core.analysis.advantage_table`: rewards as bars,
    V(s_t), δ_t, each Â^(k) and each GAE(λ) as lines; episode boundaries as vertical lines —
    terminated solid red, truncated dashed orange, end of rollout dotted grey."""
    estimate_columns = [
        c for c in table.columns if c.startswith(("k_step[", "gae[")) or c in ("value", "delta")
    ]
    columns = list(show) if show is not None else estimate_columns
    figure = go.Figure()
    # rewards on their own right-hand axis: r_t is often tiny next to V and the returns
    figure.add_trace(
        go.Bar(
            x=table["t"],
            y=table["reward"],
            name="reward r_t (right axis)",
            opacity=0.3,
            yaxis="y2",
            marker_color="#7f7f7f",
        )
    )
    for column in columns:
        dash = "dot" if column.startswith("k_step[") else None
        width = 3 if column.startswith("gae[") else 1.5
        figure.add_trace(
            go.Scatter(
                x=table["t"],
                y=table[column],
                mode="lines",
                name=_pretty(column),
                line={"dash": dash, "width": width},
            )
        )
    for flag, style in _BOUNDARY_STYLE.items():
        for t in table.loc[table[flag].astype(bool), "t"]:
            figure.add_vline(x=float(t) + 0.5, line={**style, "width": 1.5}, opacity=0.7)
        # an invisible trace so the legend explains the line style
        figure.add_trace(
            go.Scatter(
                x=[None],
                y=[None],
                mode="lines",
                name=flag.replace("_", " "),
                line={**style, "width": 1.5},
            )
        )
    _layout(figure, "Advantage estimates along the trajectory", "step t", "value / advantage")
    low = min(0.0, float(table["reward"].min())) if len(table) else 0.0
    high = max(0.0, float(table["reward"].max())) if len(table) else 1.0
    span = (high - low) or 1.0
    figure.update_layout(  # the bars fill the lowest quarter of the plot, under the lines
        yaxis2={
            "title": "reward",
            "overlaying": "y",
            "side": "right",
            "showgrid": False,
            "range": [low, low + 4 * span],
        },
        height=420,
    )
    keep = ["t", "reward", "value", "next_value", "terminated", "truncated", "end_of_rollout"]
    frame = table[list(dict.fromkeys([*keep, "delta", *columns]))]
    return figure, frame


def heatmap_figure(heat: pd.DataFrame) -> tuple[go.Figure, pd.DataFrame]:
    """GAE over (t, λ) from :func:`~gae_core.analysis.gae_heatmap`."""
    grid = heat.pivot(index="lambda", columns="t", values="gae")
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
    _layout(figure, "GAE(γ, λ) over steps and λ", "step t", label("lambda_"))
    return figure, heat


def weights_figure(weights: pd.DataFrame, lambda_: float) -> tuple[go.Figure, pd.DataFrame]:
    """Bars of each Â^(k)'s weight in GAE, the tail mass on the last one highlighted, with the
    infinite-horizon geometric weights (1−λ)λ^(k−1) as a line."""
    colors = np.where(weights["tail"], "#d62728", "#1f77b4")
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
            name="(1−λ)λ^(k−1)",
            line={"dash": "dot"},
        )
    )
    _layout(figure, f"Weight of each k-step estimator at λ = {lambda_:g}", "k", "weight")
    return figure, weights


# ----------------------------------------------------------------------------- comparison


_PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)


def comparison_figure(
    bands: pd.DataFrame,
    aligned: pd.DataFrame | None = None,
    *,
    group: str = "lambda",
    show_seeds: bool = False,
) -> tuple[go.Figure, pd.DataFrame]:
    """Mean episodic return per group with its 95 % band (one filled band per group) and,
    optionally, each seed's aligned curve. The frame is ``bands`` (plus the seeds, long)."""
    figure = go.Figure()
    for i, (key, frame) in enumerate(bands.groupby(group, sort=True)):
        color = _PALETTE[i % len(_PALETTE)]
        label = plotly_text(group_label(group, key))
        fill = _rgba(color, 0.2)
        figure.add_trace(
            go.Scatter(
                x=frame["env_step"],
                y=frame["ci_high"],
                mode="lines",
                line={"width": 0},
                showlegend=False,
                hoverinfo="skip",
                legendgroup=label,
            )
        )
        figure.add_trace(
            go.Scatter(
                x=frame["env_step"],
                y=frame["ci_low"],
                mode="lines",
                line={"width": 0},
                fill="tonexty",
                fillcolor=fill,
                name=f"{label} 95% CI",
                legendgroup=label,
            )
        )
        figure.add_trace(
            go.Scatter(
                x=frame["env_step"],
                y=frame["mean"],
                mode="lines",
                line={"color": color, "width": 2.5},
                name=f"{label} mean",
                legendgroup=label,
            )
        )
        if show_seeds and aligned is not None:
            for seed, run in aligned[aligned[group] == key].groupby("seed"):
                figure.add_trace(
                    go.Scatter(
                        x=run["env_step"],
                        y=run["return"],
                        mode="lines",
                        line={"color": color, "width": 0.8},
                        opacity=0.4,
                        name=f"{label} seed {seed}",
                        legendgroup=label,
                        showlegend=False,
                    )
                )
    _layout(figure, "Episodic return: mean and 95% CI across seeds", "env steps", "return")
    frame = bands
    if show_seeds and aligned is not None:
        frame = bands.merge(
            aligned.pivot_table(index=[group, "env_step"], columns="seed", values="return")
            .add_prefix("seed_")
            .reset_index(),
            on=[group, "env_step"],
            how="left",
        )
    return figure, frame


def _rgba(hex_color: str, alpha: float) -> str:
    r, g, b = (int(hex_color[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def _pretty(column: str) -> str:
    if column == "delta":
        return "δ_t"
    if column == "value":
        return "V(s_t)"
    if column.startswith("k_step[k="):
        return f"Â^({column[9:-1]})"
    if column.startswith("gae[lambda="):
        return f"GAE λ={column[11:-1]}"
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
    "comparison_figure",
    "downsample_indices",
    "explorer_figure",
    "heatmap_figure",
    "metric_figure",
    "metric_frame",
    "overlay_figure",
    "smooth",
    "weights_figure",
]
