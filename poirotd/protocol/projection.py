"""The paper's radial projection of binary fault vectors onto the plane (eqs. 11-12, Fig. 5).

Dimension d of N sits on a circle of radius R at angle θ_d = 2πd/N - π/2 (dimension 0 at the
bottom, then counter-clockwise); a vector maps to the mean of its active dimensions' points and
the zero vector to the origin. One-hot vectors land on the circle, multi-fault vectors inside it,
so the distance from the centre reads as how diffuse an attribution is.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

RADIUS = 0.5


def anchors(n: int, radius: float = RADIUS) -> npt.NDArray[np.float64]:
    """(n, 2): the point p_d of each dimension (eq. 11)."""
    theta = 2.0 * np.pi * np.arange(n) / n - np.pi / 2.0
    points: npt.NDArray[np.float64] = radius * np.column_stack((np.cos(theta), np.sin(theta)))
    return points


def project(vectors: npt.ArrayLike, radius: float = RADIUS) -> npt.NDArray[np.float64]:
    """(M, 2): x(v) for each row v of an (M, N) 0/1 array (eq. 12); zero rows go to the origin."""
    v = np.atleast_2d(np.asarray(vectors, dtype=np.float64))
    active = v.sum(axis=1, keepdims=True)
    sums = v @ anchors(v.shape[1], radius)
    points: npt.NDArray[np.float64] = np.divide(
        sums, active, out=np.zeros_like(sums), where=active > 0
    )
    return points
