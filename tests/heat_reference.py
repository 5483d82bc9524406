"""The heat update on one process without MPI: the tests' reference for the payload's field."""

from __future__ import annotations

import numpy as np

from workers.payloads.heat import Grid, make_scratch, stencil


def solve_serial(grid: Grid, steps: int | None = None) -> np.ndarray:
    """The same update as the payload, on one process without MPI."""
    u = np.zeros((grid.nx + 2, grid.ny + 2))
    v = np.zeros_like(u)
    u[1:-1, 1:-1] = grid.initial(0, grid.nx, 0, grid.ny)
    scratch = make_scratch(grid.ny)
    for _ in range(grid.steps if steps is None else steps):
        stencil(u, v, grid.rx, grid.ry, scratch)
        u, v = v, u
    return u[1:-1, 1:-1].copy()
