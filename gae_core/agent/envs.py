"""Gymnasium environments for the trainer: which ids can be trained, and how they are built.

Autoreset mode (gymnasium >= 1.0). We use ``AutoresetMode.NEXT_STEP`` for every vector env, chosen
explicitly for sync envs and checked for native ones, because:

* CartPole's native vector env (``vector_entry_point``, about 3x faster than a sync vector of
  single envs) implements only NEXT_STEP, and one mode for all envs means one rollout loop;
* in NEXT_STEP mode the observation returned by the step that ends an episode *is* the true final
  observation, so ``next_values[t] = values[t+1]`` holds for every row, truncated ones included,
  and the critic needs no extra forward pass for final observations.

The price is one "reset row" after every episode end: the env ignores the action, returns
reward 0 and the reset observation. The trainer marks those rows invalid and leaves them out of
the loss, the step count and the episode statistics (see ``Trainer.collect``).

Observations are cast to float32 at the env boundary (MuJoCo returns float64), so the network
never sees another dtype.

Normalisation is the trainer's, per member (:mod:`gae_core.agent.normalize`): the vector env
returns the env's own observations and rewards, so episode returns, curves and recordings are
always in the env's units.
"""

from __future__ import annotations

import functools
import threading
import warnings
from collections.abc import Mapping
from types import MappingProxyType

import gymnasium as gym
import numpy as np

from gae_core.env_modules import (
    ENV_MODULES_VAR,
    EnvModuleError,
    import_named_modules,
    registered_env_ids,
)
from gae_core.errors import UnsupportedEnvError

__all__ = [
    "CLASSIC_CONTROL",
    "MUJOCO",
    "SUPPORTED_ENVS",
    "check_env_id",
    "discrete_actions",
    "env_id_problem",
    "make_eval_env",
    "make_vector_env",
    "quiet_env_warnings",
    "reward_threshold",
]

#: Classic-control ids the trainer is tested on (flat Box observations; Discrete or 1-D Box
#: actions).
CLASSIC_CONTROL = (
    "CartPole-v1",
    "Acrobot-v1",
    "MountainCar-v0",
    "MountainCarContinuous-v0",
    "Pendulum-v1",
)
#: The GAE paper's kind of task: MuJoCo locomotion and balancing (``gymnasium[mujoco]``).
MUJOCO = (
    "InvertedPendulum-v5",
    "InvertedDoublePendulum-v5",
    "HalfCheetah-v5",
    "Hopper-v5",
    "Walker2d-v5",
)
#: Supported ids and their spec's "solved" level (None where the spec has none).
SUPPORTED_ENVS: Mapping[str, float | None] = MappingProxyType(
    {env_id: gym.spec(env_id).reward_threshold for env_id in CLASSIC_CONTROL + MUJOCO}
)

_DEFAULT_EPISODE_CAP = 1000
#: Warnings from inside an env that a user cannot act on, silenced once at the env boundary
#: (:func:`quiet_env_warnings`): gymnasium's note that a MuJoCo env's float64 Box bounds are
#: cast to float32, and MuJoCo's notice that a bundled model uses a deprecated compiler
#: attribute. Every other warning still shows.
_QUIET_GYM = r".*precision lowered by casting to float32.*"
_QUIET_MUJOCO = ("compiler attribute 'settotalmass' is deprecated",)


def quiet_env_warnings(env_id: str | None = None) -> None:
    """Silence :data:`_QUIET_GYM` (a filter, added again on every call: a test framework may
    reset the filters) and, for a MuJoCo env, :data:`_QUIET_MUJOCO` (MuJoCo imported only
    then); other MuJoCo warnings go on to Python's ``warnings``."""
    warnings.filterwarnings("ignore", message=_QUIET_GYM)
    try:
        entry = str(gym.spec(env_id).entry_point) if env_id else ""
    except gym.error.Error:
        return
    if "mujoco" in entry:
        _forward_mujoco_warnings()


@functools.cache
def _forward_mujoco_warnings() -> None:
    try:
        import mujoco
    except ImportError:  # the env will say what to install
        return

    def forward(message: str) -> None:
        if not message.startswith(_QUIET_MUJOCO):
            warnings.warn(f"MuJoCo: {message}", RuntimeWarning, stacklevel=2)

    mujoco.set_mju_user_warning(forward)


def reward_threshold(env_id: str) -> float | None:
    """The env's "solved" level from its gymnasium spec, or None where it has none."""
    try:
        threshold = gym.spec(env_id).reward_threshold
    except gym.error.Error:
        return None
    return None if threshold is None else float(threshold)


def env_id_problem(env_id: object) -> str | None:
    """Why ``env_id`` cannot be trained, in one line, or None if it can.

    Accepted: registered gymnasium ids (the ones in :data:`SUPPORTED_ENVS` are tested, and those
    the env modules named for this process register, :mod:`gae_core.env_modules`) that build
    here and whose spaces the trainer handles. Rejected: ``module:Class`` strings and any id with
    a ':' (``gym.make`` would import the module, i.e. run code named by user input), ids gymnasium
    does not know, ids whose package is missing (the message says what to install) and ids with
    spaces the trainer cannot handle. The env is built once per id and process to find out.
    """
    try:  # the modules named for this process register their envs first
        import_named_modules()
    except EnvModuleError as exc:
        return f"cannot be looked up: {exc}"

    def supported() -> str:  # a module's envs the trainer can take (not one with Dict obs)
        own = [i for i in registered_env_ids() if i not in SUPPORTED_ENVS and not _built(i)[0]]
        return ", ".join([*SUPPORTED_ENVS, *own])

    if not isinstance(env_id, str) or not env_id:
        return f"must be a non-empty string, one of: {supported()}"
    if ":" in env_id:
        return (
            f"must be a registered gymnasium id, not a 'module:Class' path; one of: {supported()}"
        )
    if env_id not in gym.envs.registry:
        # a module named that registered nothing (a typo in its register call, a guard that
        # skipped it) is the likelier cause than an unnamed one: said first
        empty = [name for name, ids in import_named_modules().items() if not ids]
        hint = (f"env module {', '.join(empty)} registered no env" if empty else
                "an env your own module registers: name the module with --env-module, or "
                f"{ENV_MODULES_VAR} for the dashboard")  # fmt: skip
        return f"{env_id!r} is not a registered environment; supported: {supported()} ({hint})"
    return _built(env_id)[0]


def discrete_actions(env_id: str) -> bool | None:
    """Whether a trainable env's actions are Discrete (a Gaussian policy's ``log_std_init`` and
    ``use_sde`` then do nothing); None where ``env_id`` cannot be trained. Reuses the build
    :func:`env_id_problem` made."""
    if env_id_problem(env_id) is not None:
        return None
    return _built(env_id)[1]


#: One env build at a time: the first build of an id imports its package, and two threads
#: importing one package's modules at once (a dashboard's sessions, a benchmark's jobs) can see
#: each other's half-imported module ("cannot import name 'CartPoleEnv' from partially
#: initialized module"), which the cache below would then keep as the id's problem.
_BUILD_LOCK = threading.Lock()


@functools.lru_cache(maxsize=64)
def _built(env_id: str) -> tuple[str | None, bool | None]:
    """``(problem, discrete actions)`` of building ``env_id`` once."""
    with _BUILD_LOCK:
        return _build(env_id)


def _build(env_id: str) -> tuple[str | None, bool | None]:
    quiet_env_warnings(env_id)
    try:
        env = gym.make(env_id)
    except gym.error.DependencyNotInstalled as exc:
        return f"{env_id} needs a package that is not installed: {_one_line(exc)}", None
    except ImportError as exc:
        return f"{env_id} needs a package that is not installed: {_one_line(exc)}", None
    except Exception as exc:  # any failure to build is reported, not raised into a form
        return f"{env_id} could not be built: {type(exc).__name__}: {_one_line(exc)}", None
    try:
        problem = _spaces_problem(env_id, env.observation_space, env.action_space)
        return problem, isinstance(env.action_space, gym.spaces.Discrete)
    finally:
        env.close()


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def check_env_id(env_id: object) -> str:
    """``env_id`` if it can be trained, else :class:`UnsupportedEnvError` with the reason."""
    problem = env_id_problem(env_id)
    if problem:
        raise UnsupportedEnvError(f"env_id {problem}")
    return env_id  # type: ignore[return-value]


def _spaces_problem(
    env_id: str, observation_space: gym.Space, action_space: gym.Space
) -> str | None:
    if not (isinstance(observation_space, gym.spaces.Box) and len(observation_space.shape) == 1):
        return (
            f"{env_id} has observation space {observation_space}; the trainer needs a flat Box "
            "(vector observations)"
        )
    discrete = isinstance(action_space, gym.spaces.Discrete)
    box = isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1
    if not (discrete or box):
        return f"{env_id} has action space {action_space}; the trainer needs Discrete or a flat Box"
    if box and not (
        np.all(np.isfinite(action_space.low)) and np.all(np.isfinite(action_space.high))
    ):
        return f"{env_id} has unbounded actions; clipping needs finite bounds"
    return None


def _float32_observations(env: gym.vector.VectorEnv) -> gym.vector.VectorEnv:
    if env.single_observation_space.dtype == np.float32:
        return env
    return gym.wrappers.vector.DtypeObservation(env, np.float32)


def make_vector_env(env_id: str, num_envs: int) -> gym.vector.VectorEnv:
    """A vector env in NEXT_STEP autoreset mode (the native one where gymnasium has it, the
    MuJoCo loop of :mod:`gae_core.agent.mujoco_vector` where that has the env's step) with
    float32 observations."""
    check_env_id(env_id)
    quiet_env_warnings(env_id)
    spec = gym.spec(env_id)
    fast = None
    if env_id in MUJOCO:  # a step without gymnasium's per-env Python, where it is written
        from gae_core.agent.mujoco_vector import make_locomotion_vector_env

        fast = make_locomotion_vector_env(env_id, num_envs)
    if fast is not None:
        env = fast
    elif spec.vector_entry_point is not None:
        env = gym.make_vec(env_id, num_envs, vectorization_mode="vector_entry_point")
    else:
        env = gym.make_vec(
            env_id,
            num_envs,
            vectorization_mode="sync",
            vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP},
        )
    mode = env.metadata.get("autoreset_mode")
    if mode is not gym.vector.AutoresetMode.NEXT_STEP:
        env.close()
        raise UnsupportedEnvError(
            f"env_id {env_id}: the trainer's rollout loop needs NEXT_STEP autoreset, "
            f"the env uses {mode}"
        )
    return _float32_observations(env)


def clip_normalized(observations: np.ndarray, clip: float) -> np.ndarray:
    """Normalised observations clipped to ±``clip``, their dtype kept (training and replay
    share it)."""
    return np.clip(observations, -clip, clip).astype(observations.dtype, copy=False)


def make_eval_env(env_id: str) -> gym.Env:
    """One plain env (with the spec's TimeLimit) for recording trajectories; float32
    observations."""
    check_env_id(env_id)
    quiet_env_warnings(env_id)
    env = gym.make(env_id)
    if env.observation_space.dtype != np.float32:
        env = gym.wrappers.DtypeObservation(env, np.float32)
    return env


def episode_cap(env: gym.Env) -> int:
    """The spec's time limit, or a cap for specs without one (the last step is then marked
    truncated)."""
    spec = env.spec
    if spec is not None and spec.max_episode_steps:
        return int(spec.max_episode_steps)
    return _DEFAULT_EPISODE_CAP
