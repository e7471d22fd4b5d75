"""The dashboard's server: ``python -m streamlit run app.py``.

It serves the Streamlit dashboard (``dashboard.py`` and ``pages/``) and, beside it, the CSV
exports of the run store at ``/export/...`` (:mod:`gae_core.insight.exports` owns those URLs and
their answers). A CSV link is a plain download read from the store when clicked: unlike a
Streamlit download button, no redraw of a live page can revoke it.
"""

from __future__ import annotations

import threading
from urllib.parse import parse_qs

import streamlit as st
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gae_core.insight import exports
from gae_core.runs.store import RunStore

_store_lock = threading.Lock()
_stores: list[RunStore] = []


def _store() -> RunStore:
    """One store handle for the exports, opened on first use (the dashboard may create the
    store after the server started); a store that cannot be opened is tried again next time."""
    with _store_lock:
        if not _stores:
            _stores.append(RunStore(recover=False))  # recovery is the run manager's job
        return _stores[0]


def _export(request: Request) -> Response:
    """Starlette runs this plain function in its thread pool, off the event loop."""
    result = exports.answer(request.url.path, parse_qs(request.url.query), _store)
    headers = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}
    if result.file_name is None:
        return Response(result.body, result.status, headers, media_type="text/plain")
    headers["Content-Disposition"] = f'attachment; filename="{result.file_name}"'
    return Response(result.body, result.status, headers, media_type="text/csv")


app = st.App("dashboard.py", routes=[Route(exports.PREFIX + "/{path:path}", _export)])
