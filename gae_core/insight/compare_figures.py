"""Plotly figures of a λ study (or any grouping of runs), built by pure functions returning
``(figure, frame)``: learning curves with bootstrap bands, the probability-of-improvement matrix
and the performance profile. Every band says how it was computed."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from gae_core.inert import plotly_text
from gae_core.insight.compare import BAND_METHODS
from gae_core.insight.grid import MARKS as GRID_MARKS
from gae_core.insight.grid import SCORES as GRID_SCORES
from gae_core.insight.stats import CONFIDENCE_TEXT, estimate_text
from gae_core.labels import assignment, format_value, label

__all__ = ["PALETTE", "comparison_figure", "grid_figure", "improvement_figure", "profile_figure"]

PALETTE = (
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


def _rgba(hex_color: str, alpha: float) -> str:
    r, g, b = (int(hex_color[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def _layout(figure: go.Figure, title: str, x_label: str, y_label: str, height: int = 380) -> None:
    figure.update_layout(
        title=title,
        xaxis_title=x_label,
        yaxis_title=y_label,
        margin={"l": 50, "r": 10, "t": 50, "b": 40},
        height=height,
        legend={"orientation": "h", "y": -0.25},
        uirevision="keep",
    )


def comparison_figure(
    bands: pd.DataFrame,
    aligned: pd.DataFrame | None = None,
    *,
    group: str = "lambda_",
    show_seeds: bool = False,
) -> tuple[go.Figure, pd.DataFrame]:
    """Per group, the IQM (or mean) return across seeds and its bootstrap band (one colour per
    group, the method in the title) and, optionally, each seed's aligned curve. The frame is
    ``bands`` (plus the seeds as ``seed_<n>`` columns; a seed with several runs is their
    mean, :data:`gae_core.insight.compare.REPLICATE`)."""
    statistic = bands["statistic"].iloc[0] if len(bands) else "iqm"
    figure = go.Figure()
    for i, (key, frame) in enumerate(bands.groupby(group, sort=True)):
        color = PALETTE[i % len(PALETTE)]
        name = plotly_text(assignment(group, key))
        figure.add_trace(
            go.Scatter(
                x=frame["env_step"],
                y=frame["ci_high"],
                mode="lines",
                line={"width": 0},
                showlegend=False,
                hoverinfo="skip",
                legendgroup=name,
            )
        )
        figure.add_trace(
            go.Scatter(
                x=frame["env_step"],
                y=frame["ci_low"],
                mode="lines",
                line={"width": 0},
                fill="tonexty",
                fillcolor=_rgba(color, 0.2),
                name=f"{name} {CONFIDENCE_TEXT} CI",
                legendgroup=name,
            )
        )
        figure.add_trace(
            go.Scatter(
                x=frame["env_step"],
                y=frame["center"],
                mode="lines",
                line={"color": color, "width": 2.5},
                name=f"{name} {statistic.upper()}",
                legendgroup=name,
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
                        name=f"{name} seed {seed}",
                        legendgroup=name,
                        showlegend=False,
                    )
                )
    _layout(figure, f"Episodic return: {BAND_METHODS[statistic]}", "env steps", "return")
    frame = bands
    if show_seeds and aligned is not None:
        seeds = aligned.pivot_table(index=[group, "env_step"], columns="seed", values="return")
        frame = bands.merge(
            seeds.add_prefix("seed_").reset_index(), on=[group, "env_step"], how="left"
        )
    return figure, frame


def improvement_figure(
    matrix: pd.DataFrame, group: str, score: str
) -> tuple[go.Figure, pd.DataFrame]:
    """The probability-of-improvement matrix of one score (its display name, e.g. ``final
    return``): cell (row x, column y) is P(X > Y) over seeds
    (:func:`gae_core.insight.stats.improvement_matrix`) with its interval."""
    keys = sorted(set(matrix["x"]) | set(matrix["y"]))
    names = [assignment(group, k) for k in keys]
    z = np.full((len(keys), len(keys)), np.nan)
    text = np.full((len(keys), len(keys)), "", dtype=object)
    for row in matrix.itertuples():
        i, j = keys.index(row.x), keys.index(row.y)
        z[i, j] = row.probability
        interval = (
            "no interval" if np.isnan(row.ci_low) else f"[{row.ci_low:.2f}, {row.ci_high:.2f}]"
        )  # (one seed in a group)
        text[i, j] = f"{row.probability:.2f}<br>{interval}"
    figure = go.Figure(
        go.Heatmap(
            z=z,
            x=names,
            y=names,
            text=text,
            texttemplate="%{text}",
            textfont={"size": 11},  # readable: Plotly shrinks it to fit small cells otherwise
            colorscale="RdBu",
            zmin=0.0,
            zmax=1.0,
            zmid=0.5,
            colorbar={"title": "P(X > Y)"},
        )
    )
    _layout(
        figure,
        f"P(row beats column) on {score}, {CONFIDENCE_TEXT} CI",
        f"Y ({label(group)})",
        f"X ({label(group)})",
        height=max(360, 120 + 56 * len(keys)),  # two lines of text in every cell
    )
    figure.update_yaxes(autorange="reversed")
    return figure, matrix


def profile_figure(profile: pd.DataFrame, group: str, score: str) -> tuple[go.Figure, pd.DataFrame]:
    """Performance profile: the share of seeds scoring above τ, per group, with bootstrap
    bands (:func:`gae_core.insight.stats.performance_profile`)."""
    figure = go.Figure()
    for i, (key, frame) in enumerate(profile.groupby("group", sort=True)):
        color = PALETTE[i % len(PALETTE)]
        name = plotly_text(assignment(group, key))
        tau = frame["tau"].to_numpy()
        figure.add_trace(
            go.Scatter(
                x=np.concatenate([tau, tau[::-1]]),
                y=np.concatenate([frame["ci_high"], frame["ci_low"][::-1]]),
                mode="lines",
                fill="toself",
                fillcolor=_rgba(color, 0.15),
                line={"width": 0},
                hoverinfo="skip",
                showlegend=False,
                legendgroup=name,
            )
        )
        figure.add_trace(
            go.Scatter(
                x=tau,
                y=frame["fraction"],
                mode="lines",
                name=name,
                line={"color": color, "width": 2, "shape": "hv"},
                legendgroup=name,
            )
        )
    _layout(
        figure,
        f"Share of seeds with {score} > τ, {CONFIDENCE_TEXT} band",
        f"τ ({score})",
        "fraction of seeds",
    )
    figure.update_yaxes(range=[-0.02, 1.02])
    frame = profile.rename(columns={"group": group})
    return figure, frame


def grid_figure(cells: pd.DataFrame, x: str, y: str) -> tuple[go.Figure, pd.DataFrame]:
    """A two-axis study as the GAE paper draws it: a heat map of one score's IQM across seeds
    over the grid (x: ``x``'s values, rows: ``y``'s), each cell's interval, mean and seeds on
    hover and in its text, the best cell starred and every cell not distinguishable from it
    marked ≈ (:func:`gae_core.insight.grid.cell_table`, whose rows are the frame returned).
    Bright is better whichever way the score points."""
    score = str(cells["score"].iloc[0]) if len(cells) else "final_return"
    what, higher = GRID_SCORES[score]
    xs = sorted(cells[x].unique())
    ys = sorted(cells[y].unique())
    z = np.full((len(ys), len(xs)), np.nan)
    text = np.full(z.shape, "", dtype=object)
    hover = np.full(z.shape, "no scores", dtype=object)
    for row in cells.to_dict("records"):
        i, j = ys.index(row[y]), xs.index(row[x])
        z[i, j] = row["iqm"]
        mark = "★ " if row["best"] else "≈ " if row["not_distinguishable"] else ""
        # whole numbers from 1,000 up: env steps and large returns, never "2e+04"
        value = row["iqm"]
        text[i, j] = f"{mark}{value:,.0f}" if abs(value) >= 1000 else f"{mark}{value:,.4g}"
        hover[i, j] = (
            f"{assignment(x, row[x])}, {assignment(y, row[y])}<br>IQM "
            f"{estimate_text(row['iqm'], row['iqm_ci_low'], row['iqm_ci_high'])}<br>mean "
            f"{estimate_text(row['mean'], row['mean_ci_low'], row['mean_ci_high'])}<br>"
            f"{row['seeds']} {'seed' if row['seeds'] == 1 else 'seeds'}"
            + (f"<br>{GRID_MARKS['best']}" if row["best"] else "")
            + (f"<br>{GRID_MARKS['not_distinguishable']}" if row["not_distinguishable"] else "")
        )
    figure = go.Figure(
        go.Heatmap(
            z=z,
            x=[format_value(v) for v in xs],
            y=[format_value(v) for v in ys],
            text=text,
            texttemplate="%{text}",
            textfont={"size": 12},
            customdata=hover,
            hovertemplate="%{customdata}<extra></extra>",
            colorscale="Viridis",
            reversescale=not higher,
            colorbar={"title": "IQM", "tickformat": ",.6~r"},  # "19,997.6", not "19.9976k"
        )
    )
    _layout(
        figure,
        f"IQM of {what.split(' (')[0]} across seeds, {CONFIDENCE_TEXT} CI on hover",
        label(x),
        label(y),
        height=max(360, 140 + 48 * len(ys)),
    )
    figure.update_xaxes(type="category")
    figure.update_yaxes(type="category")
    return figure, cells
