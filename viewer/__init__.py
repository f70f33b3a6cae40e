"""epscope's web viewer: a Dash app over run directories (pages under viewer/pages/).

`create_app(roots)` builds the app, `serve(roots, host, port)` runs it; `epscope view` calls
serve. Nothing here is imported on the recording path.
"""
from __future__ import annotations

__all__ = ["create_app", "serve"]


def create_app(roots, **kwargs):
    from .app import create_app as _create
    return _create(roots, **kwargs)


def serve(roots, host: str = "127.0.0.1", port: int = 8050):
    from .app import serve as _serve
    return _serve(roots, host=host, port=port)
