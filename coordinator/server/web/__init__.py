"""The operator page: static HTML, CSS and JavaScript served by the coordinator (no CDN)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles


def mount_web(app: FastAPI, web_dir: Path, logged_in: Callable[[Request], bool]) -> None:
    static = web_dir / "static"
    app.mount("/static", StaticFiles(directory=static), name="static")

    @app.get("/", include_in_schema=False)
    def index(request: Request) -> FileResponse:
        page = "index.html" if logged_in(request) else "login.html"
        return FileResponse(static / page, media_type="text/html")
