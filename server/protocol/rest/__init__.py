"""REST adapter (FastAPI): KServe v2 routes over the data plane."""

from .app import create_app

__all__ = ["create_app"]
