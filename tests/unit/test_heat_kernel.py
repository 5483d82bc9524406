"""The fused C heat update: built by `make kernels`, loaded by the payload, bit-identical to the numpy strips."""

from __future__ import annotations

import numpy as np
import pytest

from tests.heat_reference import solve_serial
from workers.payloads import heat


def test_kernel_is_built_and_loaded():
    assert heat.KERNEL_SO.exists(), "workers/payloads/_heat_kernel.so is missing: run `make kernels`"
    assert heat.kernel_name() == "c"


@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (64, 33), (257, 130)])
def test_fused_update_is_bit_identical_to_numpy(shape):
    rng = np.random.default_rng(sum(shape))
    u = np.zeros((shape[0] + 2, shape[1] + 2))
    u[1:-1, 1:-1] = rng.random(shape) * 10 - 5
    u[0, :], u[:, -1] = rng.random(shape[1] + 2), rng.random(shape[0] + 2)  # ghost layers take part too
    fused, strips = np.zeros_like(u), np.zeros_like(u)
    scratch = heat.make_scratch(shape[1])
    rx, ry = 0.1234567891, 0.2468013579
    for _ in range(5):  # several steps: rounding differences would compound
        heat.stencil(u, fused, rx, ry, scratch)
        heat.stencil_numpy(u, strips, rx, ry, scratch)
        assert np.array_equal(fused, strips)
        u, fused = fused.copy(), np.zeros_like(u)


def test_serial_solution_matches_numpy_path_exactly(monkeypatch):
    g = heat.Grid.from_params(heat.HeatParams(nx=40, ny=24))
    fused = solve_serial(g, steps=50)
    monkeypatch.setattr(heat, "_KERNEL", None)
    assert np.array_equal(fused, solve_serial(g, steps=50))
