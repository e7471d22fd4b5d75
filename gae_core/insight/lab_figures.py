"""Plotly figures of the estimator lab, built by pure functions returning ``(figure, frame)``:
the frame is exactly what is drawn, for the page's CSV buttons."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from gae_core.inert import plotly_text
from gae_core.insight.figures import line_mode
from gae_core.labels import assignment, label

__all__ = ["QUANTITIES", "exact_figure", "state_figure", "trade_off_figure"]

#: What the trade-off plots show, in order: column, panel title.
QUANTITIES = (
    ("bias2", "bias² (squared bias)"),
    ("variance", "variance"),
    ("mse", "MSE = bias² + variance"),
)
_PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")


def _rgba(hex_color: str, alpha: float) -> str:
    r, g, b = (int(hex_color[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


#: The least distance, in decades, between two labelled k ticks of a third-width panel.
K_TICK_DECADES = 0.25


def _k_ticks(ks) -> dict[str, list]:
    """A log k axis's ticks: one at each measured k (Plotly's own log ticks read 20 as "2"),
    labelled from the largest (the segment L) down, leaving unlabelled a tick closer than
    :data:`K_TICK_DECADES` to the last labelled one, where the two labels would overlap."""
    ks = sorted({float(k) for k in ks})
    text, kept = [], math.inf
    for k in reversed(ks):
        near = math.log10(kept) - math.log10(k) < K_TICK_DECADES
        text.append("" if near else f"{k:g}")
        kept = kept if near else k
    return {"tickvals": ks, "ticktext": text[::-1]}


def trade_off_figure(
    frames: Mapping[str, pd.DataFrame], *, kind: str = "gae"
) -> tuple[go.Figure, pd.DataFrame]:
    """bias², variance and MSE against λ (``kind="gae"``) or k (``"k_step"``), one panel each,
    one colour per critic (the keys of ``frames``: each a lab result's ``estimators`` frame),
    95 % bootstrap bands across states, and a marker at each critic's least MSE."""
    x_title = label("lambda_") if kind == "gae" else "k (steps of real reward before the critic)"
    figure = make_subplots(rows=1, cols=3, subplot_titles=[t for _, t in QUANTITIES])
    parts = []
    for i, (critic, estimators) in enumerate(frames.items()):
        color = _PALETTE[i % len(_PALETTE)]
        rows = estimators[estimators["kind"] == kind].sort_values("param")
        for col, (quantity, _) in enumerate(QUANTITIES, start=1):
            x = rows["param"].to_numpy()
            low, high = rows[f"{quantity}_ci_low"], rows[f"{quantity}_ci_high"]
            figure.add_trace(
                go.Scatter(
                    x=np.concatenate([x, x[::-1]]),
                    y=np.concatenate([high.to_numpy(), low.to_numpy()[::-1]]),
                    mode="lines",  # (Plotly marks points of short traces by default)
                    fill="toself",
                    fillcolor=_rgba(color, 0.18),
                    line={"width": 0},
                    hoverinfo="skip",
                    showlegend=False,
                    legendgroup=critic,
                ),
                row=1,
                col=col,
            )
            figure.add_trace(
                go.Scatter(
                    x=x,
                    y=rows[quantity],
                    mode=line_mode(len(x)),
                    line={"color": color, "width": 2},
                    name=plotly_text(critic),
                    legendgroup=critic,
                    showlegend=col == 1,
                ),
                row=1,
                col=col,
            )
            parts.append(
                pd.DataFrame(
                    {
                        "critic": critic,
                        "kind": kind,
                        "param": x,
                        "quantity": quantity,
                        "value": rows[quantity].to_numpy(),
                        "ci_low": low.to_numpy(),
                        "ci_high": high.to_numpy(),
                    }
                )
            )
        best = rows.loc[rows["mse"].idxmin()]
        figure.add_trace(
            go.Scatter(
                x=[best["param"]],
                y=[best["mse"]],
                mode="markers",
                marker={"symbol": "star", "size": 14, "color": color},
                name=plotly_text(f"{critic}: least MSE at {best['param']:g}"),
                legendgroup=critic,
            ),
            row=1,
            col=3,
        )
    if kind == "k_step":  # a tick at each measured k (Plotly's log ticks read 20 as "2")
        ks = sorted({float(k) for e in frames.values() for k in e.loc[e["kind"] == kind, "param"]})
        figure.update_xaxes(type="log", **_k_ticks(ks))
    figure.update_xaxes(title_text=x_title)
    figure.update_layout(
        height=380,
        margin={"l": 40, "r": 10, "t": 40, "b": 40},
        legend={"orientation": "h", "y": -0.3},
        title=None,
    )
    frame = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    return figure, frame


def state_figure(
    per_state: pd.DataFrame, states: pd.DataFrame, state: int, *, kind: str = "gae"
) -> tuple[go.Figure, pd.DataFrame]:
    """One state: the target Q̂(s, a) − V̂(s) (with ±2 standard errors of its Monte-Carlo
    estimate) against each estimator's mean ± one standard deviation over the continuations."""
    rows = per_state[(per_state["state"] == state) & (per_state["kind"] == kind)]
    rows = rows.sort_values("param")
    info = states[states["state"] == state].iloc[0]
    sd = np.sqrt(rows["variance"].to_numpy())
    x = rows["param"].to_numpy()
    figure = go.Figure()
    figure.add_trace(
        go.Scatter(
            x=np.concatenate([x, x[::-1]]),
            y=np.concatenate([rows["mean"] + sd, (rows["mean"] - sd)[::-1]]),
            mode="lines",
            fill="toself",
            fillcolor="rgba(31,119,180,0.18)",
            line={"width": 0},
            name="estimate ± 1 sd over continuations",
        )
    )
    figure.add_trace(go.Scatter(x=x, y=rows["mean"], mode="lines", name="mean estimate"))
    target, se = float(info["target"]), float(info["q_se"])
    figure.add_hrect(y0=target - 2 * se, y1=target + 2 * se, fillcolor="rgba(214,39,40,0.15)",
                     line_width=0)  # fmt: skip
    figure.add_hline(y=target, line={"color": "#d62728", "dash": "dash"})
    figure.add_trace(
        go.Scatter(
            x=[None],
            y=[None],
            mode="lines",
            line={"color": "#d62728", "dash": "dash"},
            name="target Q̂(s,a) − V̂(s) (± 2 SE)",
        )
    )
    figure.update_layout(
        height=340,
        xaxis_title=label("lambda_") if kind == "gae" else "k",
        yaxis_title="advantage (env reward units)",
        margin={"l": 40, "r": 10, "t": 30, "b": 40},
        legend={"orientation": "h", "y": -0.3},
    )
    frame = rows[["param", "mean", "variance", "bias2", "mse"]].assign(
        state=state, target=target, target_se=se
    )
    return figure, frame.reset_index(drop=True)


def exact_figure(
    lambdas: np.ndarray, moments: object, sampled: object | None = None
) -> tuple[go.Figure, pd.DataFrame]:
    """The chain's exact bias², variance and MSE of GAE(λ) (``moments``: the ``gae`` field of
    :func:`gae_core.lab.chain.exact_estimator_moments`), and where ``sampled``
    (:func:`~gae_core.lab.chain.sampled_gae_moments`) is given its Monte-Carlo estimates as
    points on the curves, MSE with ± 2 standard errors; the frame holds both (``mc_*`` columns
    on the λ rows sampled, empty elsewhere)."""
    frame = pd.DataFrame(
        {
            "lambda_": lambdas,
            "bias2": np.asarray(moments.bias) ** 2,
            "variance": np.asarray(moments.variance),
        }
    )
    frame["mse"] = frame["bias2"] + frame["variance"]
    figure = go.Figure()
    for (quantity, title), color in zip(QUANTITIES, _PALETTE, strict=False):
        figure.add_trace(go.Scatter(x=frame["lambda_"], y=frame[quantity], name=title,
                                    line={"color": color, "width": 2.5}))  # fmt: skip
    if sampled is not None:
        points = pd.DataFrame({"lambda_": sampled.lambdas, "mc_bias2": sampled.bias2,
                               "mc_variance": sampled.variance, "mc_mse": sampled.mse,
                               "mc_mse_se": sampled.mse_se})  # fmt: skip
        frame = frame.merge(points, on="lambda_", how="outer").sort_values("lambda_")
        for (quantity, title), color in zip(QUANTITIES, _PALETTE, strict=False):
            error = ({"type": "data", "array": 2 * points["mc_mse_se"], "visible": True}
                     if quantity == "mse" else None)  # fmt: skip
            figure.add_trace(go.Scatter(
                x=points["lambda_"], y=points[f"mc_{quantity}"], mode="markers",
                name=f"{title}, Monte Carlo (n = {sampled.samples:,})", error_y=error,
                marker={"color": color, "symbol": "circle-open", "size": 8},
            ))  # fmt: skip
    best = frame.loc[frame["mse"].idxmin()]
    figure.add_vline(x=float(best["lambda_"]), line={"dash": "dot", "color": "#2ca02c"})
    figure.update_layout(
        height=360,
        xaxis_title=label("lambda_"),
        yaxis_title="exact value",
        title=f"Exact (enumerated): least MSE at {assignment('lambda_', best['lambda_'])}",
        margin={"l": 40, "r": 10, "t": 40, "b": 40},
        legend={"orientation": "h", "y": -0.3},
    )
    return figure, frame.reset_index(drop=True)


#: The gradient lens's panels: quantity and title (cosine panels share a 0–1 scale).
GRADIENT_PANELS = (
    ("cosine", "cosine to g*"),
    ("pairwise_cosine", "cosine between batches"),
    ("bias2", "bias² ‖E ĝ − g*‖²"),
    ("variance", "variance tr Cov(ĝ)"),
    ("mse", "MSE E‖ĝ − g*‖²"),
    ("snr", "SNR ‖E ĝ‖² / tr Cov"),
)


_MSE_PANEL = 1 + [quantity for quantity, _ in GRADIENT_PANELS].index("mse")


def gradient_figure(table: pd.DataFrame, *, kind: str = "gae") -> tuple[go.Figure, pd.DataFrame]:
    """The gradient lens over λ (``kind="gae"``) or k (``"k_step"``): per critic, one line
    with its bootstrap band in each of :data:`GRADIENT_PANELS`, a star at each critic's least
    MSE (``table``: :attr:`gae_core.lab.gradient.GradientResult.table`). The frame holds every
    drawn point with its interval, labelled by critic."""
    figure = make_subplots(rows=1, cols=len(GRADIENT_PANELS),
                           subplot_titles=[t for _, t in GRADIENT_PANELS])  # fmt: skip
    parts = []
    for i, (critic, rows) in enumerate(table[table["kind"] == kind].groupby("critic", sort=False)):
        color = _PALETTE[i % len(_PALETTE)]
        rows = rows.sort_values("param")
        x = rows["param"].to_numpy()
        for col, (quantity, _) in enumerate(GRADIENT_PANELS, start=1):
            low, high = (
                rows[f"{quantity}_ci_low"].to_numpy(),
                rows[f"{quantity}_ci_high"].to_numpy(),
            )
            figure.add_trace(go.Scatter(
                x=np.concatenate([x, x[::-1]]), y=np.concatenate([high, low[::-1]]),
                mode="lines", fill="toself", fillcolor=_rgba(color, 0.18), line={"width": 0},
                hoverinfo="skip", showlegend=False, legendgroup=critic,
            ), row=1, col=col)  # fmt: skip
            figure.add_trace(go.Scatter(
                x=x, y=rows[quantity], mode=line_mode(len(x)), line={"color": color, "width": 2},
                name=plotly_text(critic), legendgroup=critic, showlegend=col == 1,
            ), row=1, col=col)  # fmt: skip
            parts.append(pd.DataFrame({"critic": critic, "kind": kind, "param": x,
                                       "quantity": quantity, "value": rows[quantity].to_numpy(),
                                       "ci_low": low, "ci_high": high}))  # fmt: skip
        best = rows.loc[rows["mse"].idxmin()]
        figure.add_trace(go.Scatter(
            x=[best["param"]], y=[best["mse"]], mode="markers",
            marker={"symbol": "star", "size": 14, "color": color},
            name=plotly_text(f"{critic}: least MSE at {best['param']:g}"), legendgroup=critic,
        ), row=1, col=_MSE_PANEL)  # fmt: skip
    if kind == "k_step":
        figure.update_xaxes(type="log", **_k_ticks(table.loc[table["kind"] == kind, "param"]))
    figure.update_xaxes(title_text=label("lambda_") if kind == "gae" else "k")
    figure.update_yaxes(range=[-1.02, 1.02], row=1, col=1)
    figure.update_yaxes(range=[-1.02, 1.02], row=1, col=2)
    figure.update_layout(height=380, margin={"l": 40, "r": 10, "t": 40, "b": 40},
                         legend={"orientation": "h", "y": -0.3})  # fmt: skip
    figure.update_annotations(font_size=13)  # six panel titles side by side, apart
    frame = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    return figure, frame
