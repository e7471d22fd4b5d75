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
from gae_core.insight.explorer import (
    LAMBDA_GRID,
    gae_column,
    heatmap_from_sweep,
    lambda_index,
    steps_left,
    weights_table,
)
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
    stays within the metric's display range, reaching its edge where a value lies past it (a
    point drawn there stays on the axis); None lets Plotly choose."""
    values = np.asarray(values, float)
    finite = values[np.isfinite(values)]
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
        low = display_range[0] if (values < display_range[0]).any() else low
        high = display_range[1] if (values > display_range[1]).any() else high
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
    metric = M.get(key)
    name = metric.column
    frame, outside = _clipped(full.iloc[downsample_indices(len(full))], full[name],
                              metric.display_range)  # fmt: skip
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
    if frame.empty:  # not Plotly's −1…6 by −1…4 in made-up units: no ticks, and a word
        figure.update_xaxes(showticklabels=False)
        figure.update_yaxes(showticklabels=False)
        figure.add_annotation(text="no points yet", showarrow=False, x=0.5, y=0.5,
                              xref="paper", yref="paper", font={"color": "#888"})  # fmt: skip
    if outside:
        figure.add_annotation(text=outside, showarrow=False, x=0, y=1, xanchor="left",
                              yanchor="bottom", xref="paper", yref="paper",
                              font={"color": "#888", "size": 11})  # fmt: skip
    if log_y:
        figure.update_yaxes(type="log")
    else:
        figure.update_yaxes(range=y_range(full[name].to_numpy(), metric.display_range))
    return figure, full


def _clipped(
    frame: pd.DataFrame, values: pd.Series, display_range: tuple[float, float] | None
) -> tuple[pd.DataFrame, str | None]:
    """``frame``'s value columns (raw and smoothed) clipped to the metric's display range for
    drawing, and how many of the run's ``values`` (every logged point) lie outside it, in
    words, or None where none do: a point off the range is drawn at its edge, never lost."""
    if display_range is None:
        return frame, None
    low, high = display_range
    columns = [c for c in frame.columns if c not in ("env_step", "wall_time_s")]
    frame = frame.assign(**{c: frame[c].clip(low, high) for c in columns})
    values = values.dropna()  # (a NaN is no point: not drawn, not counted)
    below, above = values[values < low], values[values > high]
    parts = [f"{len(below)} below {low:g} (lowest {below.min():.3g})"] if len(below) else []
    parts += [f"{len(above)} above {high:g} (highest {above.max():.3g})"] if len(above) else []
    if not parts:
        return frame, None
    return frame, (f"{' and '.join(parts)} of {len(values)} points, drawn at the edge; the "
                   "CSV has their values")  # fmt: skip


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
    sweep: np.ndarray,
    *,
    show: Sequence[str] | None = None,
    lambda_: float = 0.95,
    t: int = 0,
    grid: np.ndarray = LAMBDA_GRID,
) -> tuple[go.Figure, dict[str, pd.DataFrame]]:
    """The explorer in one figure whose λ slider works in the browser, without a server
    round trip: every λ's numbers (``sweep``, GAE at each λ of ``grid``, ``[len(grid), T]``)
    travel with the figure once, and a step of its slider only restyles four traces.

    Panels, sharing the step axis except the last: V(s_t) with the rewards as bars (own axis);
    δ_t, each Â^(k) and each pinned GAE(λ) in ``show`` (dotted k-steps, long-dashed pinned λ)
    with GAE at the slider's λ solid and widest; GAE over (t, λ) with the slider's λ marked;
    the weight of each Â^(k) in GAE at step ``t`` (the tail λ^(L−1) on the last one in red,
    (1−λ)λ^(k−1) dotted). Episode boundaries cross the step panels: terminated solid red,
    truncated dashed orange, end of rollout dotted grey. The slider starts at ``lambda_``.

    Returns the figure and its data as frames (CSV): ``steps`` (the per-step table with GAE at
    every grid λ, so it holds what is drawn at any slider position), ``heat`` (λ, t,
    GAE) and ``weights`` (λ, k, weight, geometric weight, tail) at step ``t``."""
    estimate_columns = [
        c for c in table.columns if c.startswith(("k_step[", "gae[")) or c == "delta"
    ]
    columns = [c for c in (show if show is not None else estimate_columns) if c != "value"]
    start = lambda_index(lambda_, grid)
    lam = label("lambda_")
    names = [f"the slider's {lam}", "weight in GAE (tail in red)", f"(1−{lam}){lam}^(k−1)"]
    horizon = int(steps_left(table["terminated"], table["truncated"])[t]) if len(table) else 1
    weights = pd.concat(
        [weights_table(float(x), horizon).assign(lambda_=float(x)) for x in grid],
        ignore_index=True,
    )[["lambda_", "k", "weight", "geometric_weight", "tail"]]
    figure = make_subplots(
        rows=4, cols=1, vertical_spacing=0.09, row_heights=[0.2, 0.36, 0.24, 0.2],
        specs=[[{"secondary_y": True}], [{}], [{}], [{}]],
        subplot_titles=["V(s_t) and rewards", "advantage estimates",
                        f"GAE({label('gamma')}, {lam}) over steps and {lam}",
                        _weights_title(grid[start], t)],
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
    for column in columns:
        # pinned λ long-dashed: near λ their viridis colours are alike (0.95 and 1), the line
        # style tells them from the slider's
        dash = "dot" if column.startswith("k_step[") else None
        dash, width = ("longdash", 2) if column.startswith("gae[") else (dash, 1.5)
        # a pinned λ says so: on the slider's λ the two lines would share a name
        name = f"{_pretty(column)} (pinned)" if column.startswith("gae[") else _pretty(column)
        figure.add_trace(
            go.Scatter(x=table["t"], y=table[column], mode="lines", name=name,
                       line={"dash": dash, "width": width, "color": estimator_color(column)}),
            row=2, col=1,
        )  # fmt: skip
    moving = [len(figure.data)]  # the traces a slider step restyles
    figure.add_trace(
        go.Scatter(x=table["t"], y=sweep[start], mode="lines", line={"width": 3.5,
                   "color": "#21918c"}, name=_pretty(gae_column(grid[start]))),
        row=2, col=1,
    )  # fmt: skip
    figure.add_trace(
        go.Heatmap(z=sweep, x=table["t"], y=grid, colorscale="RdBu", zmid=0.0,
                   colorbar={"title": "GAE", "len": 0.24, "y": 0.34}, showlegend=False,
                   name="GAE"),
        row=3, col=1,
    )  # fmt: skip
    moving.append(len(figure.data))
    ends = [0, max(len(table) - 1, 0)]
    figure.add_trace(
        go.Scatter(x=ends, y=[grid[start]] * 2, mode="lines", name=names[0], showlegend=False,
                   line={"color": "#000000", "dash": "dash", "width": 1.5}),
        row=3, col=1,
    )  # fmt: skip
    at = weights[weights["lambda_"] == grid[start]]
    moving.append(len(figure.data))
    figure.add_trace(
        go.Bar(x=at["k"], y=at["weight"], name=names[1],
               marker_color=np.where(at["tail"], "#d62728", "#1f77b4")),
        row=4, col=1,
    )  # fmt: skip
    moving.append(len(figure.data))
    figure.add_trace(
        go.Scatter(x=at["k"], y=at["geometric_weight"], mode="lines", line={"dash": "dot"},
                   name=names[2]),
        row=4, col=1,
    )  # fmt: skip
    for flag, style in _BOUNDARY_STYLE.items():
        for step in table.loc[table[flag].astype(bool), "t"]:
            for row in (1, 2, 3):
                figure.add_vline(x=float(step) + 0.5, line={**style, "width": 1.5},
                                 opacity=0.7, row=row, col=1)  # fmt: skip
        # an invisible trace so the legend explains the line style
        figure.add_trace(
            go.Scatter(x=[None], y=[None], mode="lines", name=flag.replace("_", " "),
                       line={**style, "width": 1.5}),
            row=2, col=1,
        )  # fmt: skip
    by_lambda = weights.groupby("lambda_", sort=False)
    steps = [
        {"method": "update", "label": f"{x:g}", "args": [
            {"y": [_short(sweep[i]), [float(x)] * 2, _short(w["weight"]),
                   _short(w["geometric_weight"])],
             "name": [_pretty(gae_column(x)), *names]},
            {"annotations[3].text": _weights_title(x, t), "xaxis4.range": _k_range(w)},
            moving]}
        for i, (x, (_, w)) in enumerate(zip(grid, by_lambda, strict=True))
    ]  # fmt: skip
    _layout(figure, "Advantage estimates along the trajectory", "step t", "value")
    figure.update_layout(
        height=980, xaxis_title=None, legend={"orientation": "h", "y": -0.12},
        title={"y": 0.99, "yanchor": "top"},
        sliders=[{"active": start, "steps": steps, "pad": {"t": 0, "b": 0},
                  "currentvalue": {"prefix": f"drag {lam}: {lam} = ",
                                   "font": {"size": 14, "color": "#31333f"}, "xanchor": "left"},
                  "font": {"color": "rgba(0,0,0,0)"}, "ticklen": 0, "minorticklen": 0,
                  "x": 0, "len": 1.0, "y": 1.035, "yanchor": "bottom"}],
        margin={"l": 40, "r": 10, "t": 150, "b": 40},
    )  # fmt: skip
    for row in (2, 3):
        figure.update_xaxes(matches="x", row=row, col=1)
    figure.update_xaxes(title_text="k", range=_k_range(at), row=4, col=1)
    figure.update_yaxes(title_text="V(s_t)", row=1, col=1, secondary_y=False)
    # the reward axis starts at 0 and ticks rewards themselves (constant rewards of 1 read 1,
    # not the V axis's ticks carried over)
    figure.update_yaxes(title_text="reward", row=1, col=1, secondary_y=True, showgrid=False,
                        tickmode="auto", rangemode="tozero")  # fmt: skip
    figure.update_yaxes(title_text="advantage", row=2, col=1)
    figure.update_yaxes(title_text=lam, row=3, col=1)
    figure.update_yaxes(title_text="weight", row=4, col=1)
    keep = ["t", "reward", "value", "next_value", "terminated", "truncated", "end_of_rollout"]
    frame = table[list(dict.fromkeys([*keep, "delta", *columns]))].copy()
    every = pd.DataFrame({gae_column(x): sweep[i] for i, x in enumerate(grid)}, index=frame.index)
    frame = pd.concat([frame, every[[c for c in every if c not in frame]]], axis=1)
    return figure, {"steps": frame, "heat": heatmap_from_sweep(sweep, grid), "weights": weights}


def _weights_title(lambda_: float, t: int) -> str:
    return f"weight of each Â^(k) in GAE at step t = {t}, {assignment('lambda_', lambda_)}"


def _k_range(weights: pd.DataFrame) -> list[float]:
    """The weights panel's k axis: up to the k that holds 99 % of the weight, or to the tail
    where the tail carries 1 % or more, so the bars that carry weight fill the panel."""
    cumulative = np.cumsum(weights["weight"].to_numpy())
    last = int(weights["k"].iloc[-1])
    if float(weights["weight"].iloc[-1]) < 0.01:
        last = int(weights["k"].iloc[int(np.searchsorted(cumulative, 0.99 * cumulative[-1]))])
    return [0.5, last + 0.5]


def _short(values: Sequence[float]) -> list[float]:
    """Numbers a slider step carries to the browser, at float32's precision (7 significant
    digits) rather than float64's 17: the figure holds every λ's data at once."""
    return [float(f"{v:.7g}") for v in np.asarray(values, dtype=float)]


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
    "metric_figure",
    "metric_frame",
    "overlay_figure",
    "smooth",
]
