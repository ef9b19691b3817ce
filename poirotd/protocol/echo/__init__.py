"""ECHO (Banerjee et al., 2025): a hierarchical context of the session, a panel of analysts
with distinct roles, and confidence-weighted consensus with a disagreement report."""

from poirotd.protocol.echo.method import attribute

__all__ = ["attribute"]
