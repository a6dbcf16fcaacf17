"""The error the capture tools raise."""

from __future__ import annotations


class CaptureError(ValueError):
    """Arguments that the captured graphs cannot serve."""
