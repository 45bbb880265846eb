"""The bundled model's published map, as a Codec client reads it (tests/core/render's)."""

from tests.core.render.conftest import smollm2_map

__all__ = ["smollm2_map"]
