"""The dashboard's server: ``python -m streamlit run app.py``.

It serves the Streamlit dashboard (``dashboard.py`` and ``pages/``) and, beside it, the CSV
exports of the run store at ``/export/...`` (:mod:`gae_core.insight.exports` owns those URLs and
their answers). A CSV link is a plain download read from the store when clicked: unlike a
Streamlit download button, no redraw of a live page can revoke it.
"""

from __future__ import annotations

from urllib.parse import parse_qs

import streamlit as st
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gae_core.insight import exports

#: the exports' store: read-only where the data folder is, reopened when its file is moved away
_store = exports.StoreSource()


def _export(request: Request) -> Response:
    """Starlette runs this plain function in its thread pool, off the event loop."""
    result = exports.answer(request.url.path, parse_qs(request.url.query), _store)
    headers = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}
    if result.file_name is None:
        return Response(result.body, result.status, headers, media_type="text/plain")
    headers["Content-Disposition"] = f'attachment; filename="{result.file_name}"'
    return Response(result.body, result.status, headers, media_type="text/csv")


app = st.App("dashboard.py", routes=[Route(exports.PREFIX + "/{path:path}", _export)])
