"""Wires memory_core and extraction into the proxy for `memrelay serve`."""

from __future__ import annotations

from proxy.app import create_app
from proxy.asgi import ASGIApp
from proxy.settings import Settings


def build_app(settings: Settings) -> ASGIApp:
    """The app `memrelay serve` runs."""
    return create_app(settings)
