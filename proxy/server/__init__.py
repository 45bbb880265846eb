"""The aiohttp edge: app factory, routes, handlers that pump bytes through `proxy.core`."""

from proxy.server.app import create_app

__all__ = ["create_app"]
