"""CSV exports of what the store holds, served over HTTP by the dashboard (``app.py``).

The one owner of the export URLs: the pages build links with the ``*_url`` functions, and
``app.py`` answers them with :func:`answer`. A link is a plain HTTP download that reads the store
when it is clicked, so it always holds every point logged until then, and nothing on the page can
revoke it: Streamlit's own download buttons hand out a file that its next script or fragment run
may delete, and with charts redrawing every second on a loaded machine 1 click in 30 downloaded
nothing (the CI failure this replaced).

URLs (absolute; the dashboard serves them next to its pages):

* ``/export/runs.csv?status=…&env=…&text=…``: the runs table (the columns of
  :func:`~gae_core.storage.table.runs_frame`) filtered like the Runs page (``status`` and ``env``
  may repeat).
* ``/export/runs/<run_id>/<column>.csv?smoothing=w``: one metric of one run, every logged point,
  with the TensorBoard-smoothed column when ``w > 0``
  (:func:`~gae_core.insight.figures.metric_frame`).
* ``/export/overlay/<column>.csv?run=<id>&run=<id>…&smoothing=w``: one metric of several runs,
  long, with a ``run`` column (:func:`~gae_core.insight.figures.overlay_figure`'s frame).

``<column>`` is the metric's CSV column (:attr:`gae_core.metrics.Metric.column`); a run is named
by its id or, as on the command line, its first ``SHORT_ID`` or more characters.

The store is read through a :class:`StoreSource`: opened like the CLI's ``runs`` opens it (a
read-only data folder is read read-only), and opened again when the file at its path is no
longer the one it opened (moved away or replaced), so a moved store is never served.
"""

from __future__ import annotations

import hashlib
import numbers
import os
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import pandas as pd

from gae_core import metrics as M
from gae_core.errors import StoreError, UnknownId
from gae_core.inert import to_csv
from gae_core.insight import figures, views
from gae_core.labels import run_label
from gae_core.storage.records import STATUSES
from gae_core.storage.store import DB_FILENAME, RunStore, open_for_reading, resolve_data_dir
from gae_core.storage.table import runs_frame

__all__ = [
    "PREFIX",
    "Answer",
    "StoreSource",
    "answer",
    "download_name",
    "overlay_url",
    "run_metric_url",
    "runs_url",
    "with_provenance",
]

PREFIX = "/export"
_RUN_ID = re.compile(r"[0-9a-f]{1,32}")
_MAX_OVERLAY_RUNS = 50


@dataclass(frozen=True)
class Answer:
    """An HTTP answer: status, body, and the file name a CSV is saved under (None for an error,
    whose body is one plain-text line naming what was wrong)."""

    status: int
    body: str
    file_name: str | None = None


def _query(params: Mapping[str, object]) -> str:
    pairs = []
    for name, value in params.items():
        values = value if isinstance(value, list | tuple) else [value]
        pairs += [(name, str(v)) for v in values if v is not None and v != ""]
    return f"?{urlencode(pairs)}" if pairs else ""


def runs_url(*, statuses: Sequence[str] = (), envs: Sequence[str] = (), text: str = "") -> str:
    return f"{PREFIX}/runs.csv" + _query(
        {"status": list(statuses), "env": list(envs), "text": text}
    )


def run_metric_url(run_id: str, key: str, *, smoothing: float = 0.0) -> str:
    column = quote(M.get(key).column, safe="")
    return f"{PREFIX}/runs/{run_id}/{column}.csv" + _query(
        {"smoothing": f"{smoothing:g}" if smoothing > 0 else None}
    )


def overlay_url(run_ids: Sequence[str], key: str, *, smoothing: float = 0.0) -> str:
    column = quote(M.get(key).column, safe="")
    return f"{PREFIX}/overlay/{column}.csv" + _query(
        {"run": list(run_ids), "smoothing": f"{smoothing:g}" if smoothing > 0 else None}
    )


def _file_identity(path: Path) -> tuple[int, int] | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_dev, stat.st_ino


class StoreSource:
    """The store the exports read, as ``answer``'s ``store`` argument: one handle per process,
    opened on first use (the dashboard may create the store after the server started) with
    :func:`~gae_core.storage.store.open_for_reading` (recovery is the run manager's job), and
    opened again when ``<data_dir>/runs.sqlite3`` is no longer the file it opened. A store that
    cannot be opened raises ``StoreError`` and is tried again next time."""

    def __init__(self, data_dir: str | os.PathLike[str] | None = None) -> None:
        self._data_dir = data_dir
        self._lock = threading.Lock()
        self._store: RunStore | None = None
        self._identity: tuple[int, int] | None = None

    def __call__(self) -> RunStore:
        with self._lock:
            path = resolve_data_dir(self._data_dir) / DB_FILENAME
            store = self._store
            if store is not None and (store.path != path or _file_identity(path) != self._identity):
                self._store = None
                store.close()  # moved away or replaced: the path's file is another one now
                store = None
            if store is None:
                store = open_for_reading(self._data_dir, recover=False)
                self._store, self._identity = store, _file_identity(store.path)
            return store

    def close(self) -> None:
        with self._lock:
            if self._store is not None:
                self._store.close()
                self._store = None


class _BadRequest(ValueError):
    status = 400


class _NotFound(ValueError):
    status = 404


def _metric(column: str) -> M.Metric:
    for metric in M.REGISTRY.values():
        if metric.column == column:
            return metric
    known = ", ".join(sorted(m.column for m in M.REGISTRY.values()))
    raise _NotFound(f"unknown metric {column!r}; known: {known}")


def _run_id(value: str, store: RunStore) -> str:
    """The stored run id ``value`` names: the id, or its first ``SHORT_ID`` or more characters
    (as the CLI takes it)."""
    if not _RUN_ID.fullmatch(value):  # (as the store says it of an id it does not hold)
        raise _NotFound(f"no run {value!r} in {store.path}")
    try:
        return store.resolve_run_id(value)
    except UnknownId as error:
        raise _NotFound(str(error)) from None


def _smoothing(query: Mapping[str, Sequence[str]]) -> float:
    values = query.get("smoothing") or ["0"]
    try:
        weight = float(values[-1])
    except ValueError:
        weight = -1.0
    if not 0.0 <= weight < 1.0:
        raise _BadRequest(f"smoothing must be a number in [0, 1), got {values[-1]!r}")
    return weight


def _runs(store: RunStore, query: Mapping[str, Sequence[str]]) -> Answer:
    statuses = list(query.get("status", []))
    unknown = sorted(set(statuses) - set(STATUSES))
    if unknown:
        raise _BadRequest(f"status must be among {', '.join(STATUSES)}, got {unknown[0]!r}")
    text = (query.get("text") or [""])[-1]
    table = runs_frame(store.list_runs())
    shown = views.filter_runs(table, statuses=statuses, envs=list(query.get("env", [])), text=text)
    return Answer(200, to_csv(shown.reset_index(drop=True)), "runs.csv")


def _run_metric(store: RunStore, run_id: str, column: str, query) -> Answer:
    metric, run_id = _metric(column), _run_id(run_id, store)
    weight = _smoothing(query) if metric.smoothed else 0.0
    frame = figures.metric_frame(
        store.metrics(run_id, [metric.key]), metric.key, smoothing=weight, every_point=True
    )
    config = store.get_run(run_id).config
    made_by = {"run_id": run_id, **{f: config.get(f) for f in RUN_SETTINGS}, "smoothing": weight}
    file_name = download_name(f"{metric.column}.csv", made_by)
    return Answer(200, to_csv(with_provenance(frame, **made_by)), file_name)


#: The config fields a run's metric CSV names beside its run id (what tells runs apart).
RUN_SETTINGS = ("env_id", "algo", "gamma", "lambda_", "seed")


def _overlay(store: RunStore, column: str, query) -> Answer:
    metric = _metric(column)
    given = list(dict.fromkeys(query.get("run", [])))
    if not 1 <= len(given) <= _MAX_OVERLAY_RUNS:
        raise _BadRequest(f"run must be given 1 to {_MAX_OVERLAY_RUNS} times, got {len(given)}")
    ids = list(dict.fromkeys(_run_id(run_id, store) for run_id in given))
    runs, settings = {}, {}
    for run_id in ids:
        try:
            run = store.get_run(run_id)
        except StoreError:  # deleted since the check
            raise _NotFound(f"no run {run_id!r} in {store.path}") from None
        name = run_label(run)  # as the overlay's legend names it (the id makes it unique)
        runs[name] = store.metrics(run.id, [metric.key])
        settings[name] = {"run_id": run.id, **{f: run.config.get(f) for f in RUN_SETTINGS}}
    weight = _smoothing(query) if metric.smoothed else 0.0
    _, frame = figures.overlay_figure(runs, metric.key, smoothing=weight)
    if not frame.empty:  # each row names its run as a run's own CSV does, beside its label
        per_row = pd.DataFrame([settings[name] for name in frame["run"]], index=frame.index)
        frame = pd.concat([frame[["run"]], per_row, frame.drop(columns="run")], axis=1)
    file_name = download_name(f"overlay_{metric.column}.csv", {"run_ids": " ".join(ids)})
    return Answer(200, to_csv(with_provenance(frame, smoothing=weight)), file_name)


def answer(path: str, query: Mapping[str, Sequence[str]], store: Callable[[], RunStore]) -> Answer:
    """The answer to ``GET path?query`` (``query`` as ``urllib.parse.parse_qs`` gives it),
    reading the store that ``store()`` opens. Bad requests and unknown runs or metrics get one
    line naming the field; a store that cannot be read gets a 503 naming its path."""
    parts = path.removeprefix(PREFIX).strip("/").split("/")
    try:
        if parts == ["runs.csv"]:
            return _runs(store(), query)
        if len(parts) == 3 and parts[0] == "runs" and parts[2].endswith(".csv"):
            return _run_metric(store(), parts[1], parts[2].removesuffix(".csv"), query)
        if len(parts) == 2 and parts[0] == "overlay" and parts[1].endswith(".csv"):
            return _overlay(store(), parts[1].removesuffix(".csv"), query)
        raise _NotFound(f"no export at {path!r}")
    except (_BadRequest, _NotFound) as error:
        return Answer(error.status, str(error))
    except StoreError as error:
        return Answer(503, f"the run store cannot be read: {error}")


_UNSAFE_IN_FILE_NAME = re.compile(r"[^A-Za-z0-9_.-]")


def download_name(base: str, made_by: Mapping[str, Any] | None = None) -> str:
    """The name a CSV is saved under: ``base`` led by what its numbers are of (``made_by``, as
    :func:`with_provenance` takes it), so downloads from different runs or sweeps do not
    overwrite each other: ``<run_id>_<base>`` for one run, ``sweep-<sweep_id>_<base>`` for a
    sweep, ``runs-<digest>_<base>`` for runs picked one by one (``run_ids``, space-separated;
    the digest is the first 8 hex digits of SHA-256 over the sorted ids, so the same runs give
    the same name), and ``base`` alone for anything else (the exact chain). Every character
    outside ``[A-Za-z0-9_.-]`` becomes ``_``: a name is never a path."""
    made_by = made_by or {}
    if made_by.get("run_id") is not None:
        lead = str(made_by["run_id"])
    elif made_by.get("sweep_id") is not None:
        lead = f"sweep-{made_by['sweep_id']}"
    elif made_by.get("run_ids"):
        ids = " ".join(sorted(str(made_by["run_ids"]).split()))
        lead = f"runs-{hashlib.sha256(ids.encode()).hexdigest()[:8]}"
    else:
        lead = ""
    return _UNSAFE_IN_FILE_NAME.sub("_", f"{lead}_{base}" if lead else base)


def with_provenance(frame: pd.DataFrame, **made_by: Any) -> pd.DataFrame:
    """``frame`` with what made it as leading constant columns (``run_id``, ``policy_step``,
    ``critic_step``, ``gamma``, a lab's settings…, in the order given), so a CSV computed on a
    page says which run, checkpoints and settings it holds wherever it goes; a column the frame
    already has keeps its own values, and a setting that is not a plain value (a list) is left
    out. Spreadsheets and pandas read it like any other column."""
    scalar = (str, numbers.Number, type(None))  # NumPy's numbers too
    plain = {name: value for name, value in made_by.items()
             if name not in frame.columns and isinstance(value, scalar)}  # fmt: skip
    return pd.concat([pd.DataFrame(plain, index=frame.index), frame], axis=1)
