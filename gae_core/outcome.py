"""How a run ended, judged from its episode returns: the one owner of Gym's "solved" rule.

Gym's convention: an environment is solved when the mean return of ``SOLVED_WINDOW`` (100)
consecutive episodes reaches the spec's ``reward_threshold``. Every figure here uses *full*
windows only, so a lucky handful of early episodes is never called "solved" or "best":

* ``best_return``: the best mean of 100 consecutive episodes (None before 100 episodes);
* ``final_return``: the mean of the last 100 episodes (of all of them while fewer have ended),
  read at the end of the budget for a finished run;
* ``solved_at_step``: the env step at which a full window first reached the threshold;
* ``fell_below_at_step``: the first env step after that at which the window mean dropped below
  the threshold again (a run that solved and then collapsed says so);
* ``stayed_solved``: whether the last full window is still at the threshold.

The trainer's run loop feeds a :class:`ReturnTracker` episode by episode; analyses recompute the
same numbers from stored returns with :func:`summarize_returns`.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "SOLVED_WINDOW", "ReturnTracker", "RunSummary", "final_window_share", "summarize_returns"
]  # fmt: skip

#: Episodes in the moving window for "solved", the best and the final return (Gym's convention).
SOLVED_WINDOW = 100


@dataclass(frozen=True)
class RunSummary:
    """Headline numbers of a run, kept up to date on every flush (see the module docstring)."""

    episodes: int = 0
    best_return: float | None = None
    final_return: float | None = None
    reward_threshold: float | None = None
    solved_at_step: int | None = None
    fell_below_at_step: int | None = None
    stayed_solved: bool | None = None

    @property
    def solved(self) -> bool | None:
        """Whether a full window ever reached the threshold; None where there is no threshold."""
        if self.reward_threshold is None:
            return None
        return self.solved_at_step is not None

    @property
    def solved_state(self) -> str | None:
        """How the run stands against the threshold, in one word: ``"no"`` (never solved),
        ``"stayed"`` (solved and never fell below), ``"dipped"`` (fell below, back above at the
        end), ``"fell"`` (below at the end); None where there is no threshold."""
        if self.solved is None:
            return None
        if not self.solved:
            return "no"
        if self.fell_below_at_step is None:
            return "stayed"
        return "dipped" if self.stayed_solved else "fell"


class ReturnTracker:
    """Incremental :class:`RunSummary` over episode returns given in the order they ended."""

    def __init__(self, reward_threshold: float | None, window: int = SOLVED_WINDOW) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.reward_threshold = reward_threshold
        self.window = window
        self._returns: deque[float] = deque(maxlen=window)
        self.episodes = 0
        self.best_return: float | None = None
        self.solved_at_step: int | None = None
        self.fell_below_at_step: int | None = None
        self._last_full_mean: float | None = None

    def add(self, env_step: int, return_: float) -> None:
        self._returns.append(float(return_))
        self.episodes += 1
        if len(self._returns) < self.window:
            return
        mean = self.final_return
        assert mean is not None
        self._last_full_mean = mean
        if self.best_return is None or mean > self.best_return:
            self.best_return = mean
        threshold = self.reward_threshold
        if threshold is None:
            return
        if self.solved_at_step is None:
            if mean >= threshold:
                self.solved_at_step = int(env_step)
        elif self.fell_below_at_step is None and mean < threshold:
            self.fell_below_at_step = int(env_step)

    @property
    def final_return(self) -> float | None:
        if not self._returns:
            return None
        # fsum of the window, not a running sum: a running sum drifts over millions of episodes.
        return math.fsum(self._returns) / len(self._returns)

    def summary(self) -> RunSummary:
        threshold = self.reward_threshold
        stayed = None
        if threshold is not None:
            stayed = (
                self.solved_at_step is not None
                and self._last_full_mean is not None
                and self._last_full_mean >= threshold
            )
        return RunSummary(
            episodes=self.episodes,
            best_return=self.best_return,
            final_return=self.final_return,
            reward_threshold=threshold,
            solved_at_step=self.solved_at_step,
            fell_below_at_step=self.fell_below_at_step,
            stayed_solved=stayed,
        )


def summarize_returns(
    env_steps: Sequence[int],
    returns: Sequence[float],
    reward_threshold: float | None,
    window: int = SOLVED_WINDOW,
) -> RunSummary:
    """:class:`RunSummary` of episodes given in the order they ended."""
    tracker = ReturnTracker(reward_threshold, window)
    for step, value in zip(env_steps, returns, strict=True):
        tracker.add(int(step), float(value))
    return tracker.summary()


def final_window_share(env_steps: Sequence[int], window: int = SOLVED_WINDOW) -> float:
    """The share of a run's env steps (to its last finished episode; episodes in the order they
    ended) that its final return's last ``window`` episodes span: 1 where it has no more than
    ``window`` episodes. Near 1, the final return averages most of training, not its end."""
    steps = [int(step) for step in env_steps]
    if len(steps) <= window or steps[-1] <= 0:
        return 1.0
    return (steps[-1] - steps[-window - 1]) / steps[-1]
