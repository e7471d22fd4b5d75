"""One recorded episode as numpy arrays: what the agent writes, the store keeps as bytes and the
explorer and the lab read. It depends on numpy only, so storage never needs the agent."""

from __future__ import annotations

import io
from dataclasses import dataclass, fields

import numpy as np

__all__ = ["Trajectory"]


@dataclass
class Trajectory:
    """One recorded evaluation episode of length T (row t is s_t → s_{t+1}).

    ``next_observations[t]`` is the true next observation (the final one on truncation), and
    ``next_values[t]`` its value, also on termination: the estimators apply the mask.
    ``actions`` are the sampled actions (unclipped for continuous spaces) whose ``log_probs``
    are stored. Observations and ``rewards`` are the environment's own, never normalised;
    ``values`` are in the same reward units: the critic's output times ``value_scale``, the σ
    of the run's reward normalisation at that checkpoint (1 without it).
    """

    observations: np.ndarray  # [T, obs_dim] float32
    next_observations: np.ndarray  # [T, obs_dim] float32
    actions: np.ndarray  # [T] int64 or [T, action_dim] float32
    rewards: np.ndarray  # [T] float32
    values: np.ndarray  # [T] float32
    next_values: np.ndarray  # [T] float32
    terminated: np.ndarray  # [T] bool
    truncated: np.ndarray  # [T] bool
    log_probs: np.ndarray  # [T] float32
    value_scale: np.float32 = np.float32(1.0)  # noqa: RUF009 - immutable numpy scalar

    def __len__(self) -> int:
        return len(self.rewards)

    def to_bytes(self) -> bytes:
        """npz bytes; :meth:`from_bytes` inverts it."""
        out = io.BytesIO()
        np.savez(out, **{f.name: getattr(self, f.name) for f in fields(self)})
        return out.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> Trajectory:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            # recordings of earlier versions have no value_scale: their values were unscaled
            return cls(**{f.name: npz[f.name] for f in fields(cls) if f.name in npz.files})
