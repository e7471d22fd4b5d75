"""Bring-your-own environments: Python modules that register gymnasium envs when imported (the
RL-Zoo's ``--gym-packages``), named by whoever starts the command or the server, never by a form.

``python -m gae_core --env-module PKG …`` (repeatable) and ``GAE_CORE_ENV_MODULES=pkg1,pkg2`` for
the dashboard both end up in the :data:`ENV_MODULES_VAR` environment variable of the process, so
every process it starts (local workers, Ray tasks, which get it passed on) imports
the same modules before it builds an env (:func:`import_named_modules`), and a run stores the
modules it needed with its code's provenance (:func:`gae_core.version.source_version`).
"""

from __future__ import annotations

import importlib
import os
import re
import threading
from collections.abc import Sequence

#: The environment variable that names the modules, comma-separated.
ENV_MODULES_VAR = "GAE_CORE_ENV_MODULES"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
#: Env ids each imported module registered, in import order.
_REGISTERED: dict[str, tuple[str, ...]] = {}
#: Two threads importing one module at once (a dashboard's sessions): the second would read the
#: registry after the first's import and record that the module registered nothing.
_IMPORT_LOCK = threading.Lock()


class EnvModuleError(ValueError):
    """A named env module is not a module name, cannot be found or fails to import."""


def missing_modules_note(code: dict | None) -> str:
    """Where a stored run was trained with env modules (its code's provenance, ``code``) this
    process was not told to import, what to name to rebuild its env; else ""."""
    recorded = (code or {}).get("env_modules") or ()
    missing = [name for name in recorded if name not in named_modules()]
    if not missing:
        return ""
    names = ", ".join(missing)
    flags = " ".join(f"--env-module {name}" for name in missing)
    return (
        f"it was trained with env module {names}, which this process does not import: "
        f"name it with {flags} (the dashboard: {ENV_MODULES_VAR}={','.join(missing)})"
    )


def named_modules() -> tuple[str, ...]:
    """The modules :data:`ENV_MODULES_VAR` names (empty entries dropped), in order."""
    raw = os.environ.get(ENV_MODULES_VAR, "")
    return tuple(dict.fromkeys(part.strip() for part in raw.split(",") if part.strip()))


def import_env_modules(names: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """Import each module (once per process) and return the env ids it registered with
    gymnasium; :class:`EnvModuleError` naming the module, in one line, for a name that is not a
    dotted module name, a module that cannot be found, or one whose import raises."""
    with _IMPORT_LOCK:  # one import at a time: what a module registered is read around it
        return _import_env_modules(names)


def _import_env_modules(names: Sequence[str]) -> dict[str, tuple[str, ...]]:
    import gymnasium as gym

    found: dict[str, tuple[str, ...]] = {}
    for name in names:
        if name in _REGISTERED:
            found[name] = _REGISTERED[name]
            continue
        if not _NAME.fullmatch(name):
            raise EnvModuleError(f"env module {name!r} is not a Python module name (a.b.c)")
        before = set(gym.envs.registry)
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and (exc.name == name or name.startswith(exc.name + ".")):
                raise EnvModuleError(
                    f"env module {name!r} not found (is it installed, or on PYTHONPATH?)"
                ) from None
            raise EnvModuleError(f"env module {name!r} failed to import: {_line(exc)}") from None
        except Exception as exc:  # the module's own failure, reported in one line
            raise EnvModuleError(f"env module {name!r} failed to import: {_line(exc)}") from None
        _REGISTERED[name] = found[name] = tuple(sorted(set(gym.envs.registry) - before))
    return found


def _line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


def import_named_modules() -> dict[str, tuple[str, ...]]:
    """:func:`import_env_modules` of :func:`named_modules` (cheap after the first call)."""
    return import_env_modules(named_modules())


def use_env_modules(names: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """Import ``names`` and add them to :data:`ENV_MODULES_VAR` for this process and those it
    starts (the CLI's ``--env-module``)."""
    found = import_env_modules(names)
    os.environ[ENV_MODULES_VAR] = ",".join(dict.fromkeys([*named_modules(), *names]))
    return found


def registered_env_ids() -> tuple[str, ...]:
    """The env ids the imported modules registered, in import order."""
    return tuple(dict.fromkeys(i for ids in _REGISTERED.values() for i in ids))
