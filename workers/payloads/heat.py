"""2-D heat equation u_t = alpha (u_xx + u_yy) on the unit square, explicit Euler, with MPI.

Grid: nx x ny interior points, h = 1/(n+1), Dirichlet 0 on the boundary, and
u0 = sin(mx pi x) sin(my pi y), whose exact solution is
u = exp(-alpha pi^2 (mx^2 + my^2) t) u0. dt = cfl min(hx, hy)^2 / alpha, shortened
so that a whole number of steps lands on t_end.

The ranks form a 2-D Cartesian communicator; each owns a block with one ghost
layer, exchanged every step with Isend/Irecv. The 5-point update is element-wise
with a fixed operation order, so the field is bit-identical for any rank count.

Checkpoints (every ``checkpoint_every`` steps, and on SIGTERM/SIGUSR1) hold the
gathered global field, the step and the norm series, written by rank 0 to
``ckpt/state.npz``; a restart on any rank count continues from them. A stop
request is agreed on by an allreduce every few steps, so all ranks stop at the
same step, checkpoint, and exit 75.

Outputs: ``out/field.npz`` (u, exact, x, y, t), ``out/series.json`` (step, t,
l2_norm, analytic_l2_norm) and metrics (see the README); ``hosts`` lists, rank by
rank, the machine each rank ran on as MPI names it (``MPI_Get_processor_name``), so a
run over several nodes shows where its ranks were.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from upwell.payloads.models import HeatParams
from workers.payloads.common import (
    EXIT_OK,
    EXIT_PREEMPTED,
    BadInput,
    Context,
    atomic_write,
    atomic_write_json,
    install_stop_handler,
    mark_preempted,
    read_progress,
    run_main,
    save_checkpoint,
    write_metrics,
)

STATE_FILE = "state.npz"
CHUNK_CELLS = 1 << 14  # cells per stencil strip: keeps the three temporaries in L2 cache
SERIES_POINTS = 200


@dataclass(frozen=True)
class Grid:
    """The discretisation every rank agrees on; ``key`` decides whether a checkpoint fits."""

    nx: int
    ny: int
    alpha: float
    mode_x: int
    mode_y: int
    dt: float
    steps: int

    @classmethod
    def from_params(cls, p: HeatParams) -> Grid:
        ny = p.ny or p.nx
        h = min(1.0 / (p.nx + 1), 1.0 / (ny + 1))
        steps = max(1, math.ceil(p.t_end / (p.cfl * h * h / p.alpha)))
        return cls(p.nx, ny, p.alpha, p.mode_x, p.mode_y, p.t_end / steps, steps)

    @property
    def hx(self) -> float:
        return 1.0 / (self.nx + 1)

    @property
    def hy(self) -> float:
        return 1.0 / (self.ny + 1)

    @property
    def rx(self) -> float:
        return self.alpha * self.dt / self.hx**2

    @property
    def ry(self) -> float:
        return self.alpha * self.dt / self.hy**2

    @property
    def decay_rate(self) -> float:
        return self.alpha * math.pi**2 * (self.mode_x**2 + self.mode_y**2)

    def key(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    def initial(self, x0: int, x1: int, y0: int, y1: int) -> np.ndarray:
        """u0 on the global index block [x0, x1) x [y0, y1)."""
        x = np.arange(x0 + 1, x1 + 1) * self.hx
        y = np.arange(y0 + 1, y1 + 1) * self.hy
        return np.outer(np.sin(self.mode_x * math.pi * x), np.sin(self.mode_y * math.pi * y))

    def exact(self, step: int) -> np.ndarray:
        return math.exp(-self.decay_rate * step * self.dt) * self.initial(0, self.nx, 0, self.ny)

    def exact_norm(self, step: int) -> float:
        # sum_i sin^2(m pi i h) = (n + 1) / 2 on this grid, so the discrete norm of u0 is 1/2
        return 0.5 * math.exp(-self.decay_rate * step * self.dt)


def split(n: int, parts: int, index: int) -> tuple[int, int]:
    """[start, stop) of block ``index`` when n points go to ``parts`` blocks differing by at most one."""
    base, extra = divmod(n, parts)
    start = index * base + min(index, extra)
    return start, start + base + (1 if index < extra else 0)


KERNEL_SO = Path(__file__).with_name("_heat_kernel.so")


def _load_kernel():
    """The fused C update (heat_kernel.c, built by ``make kernels``), or None where it is not built or
    UPWELL_HEAT_KERNEL=numpy asks for the strips. Both give bit-identical fields."""
    if os.environ.get("UPWELL_HEAT_KERNEL", "").lower() == "numpy" or not KERNEL_SO.exists():
        return None
    lib = ctypes.CDLL(str(KERNEL_SO))
    fn = lib.heat_step
    fn.restype = None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_long, ctypes.c_long,
                   ctypes.c_double, ctypes.c_double]
    return fn


_KERNEL = _load_kernel()


def kernel_name() -> str:
    return "c" if _KERNEL is not None else "numpy"


def _rows_ok(a: np.ndarray) -> bool:
    return a.dtype == np.float64 and a.ndim == 2 and a.strides[1] == 8 and a.strides[0] % 8 == 0


def stencil(u: np.ndarray, out: np.ndarray, rx: float, ry: float, scratch: np.ndarray) -> None:
    """out interior = c + rx (n + s - 2c) + ry (w + e - 2c), the same operation order for every cell.

    ``u`` and ``out`` carry one ghost layer. One fused pass in C where built, else numpy strips."""
    if _KERNEL is not None and _rows_ok(u) and _rows_ok(out) and u.shape == out.shape:
        _KERNEL(u.ctypes.data, out.ctypes.data, u.shape[0] - 2, u.shape[1] - 2, u.strides[0] // 8,
                out.strides[0] // 8, float(rx), float(ry))
        return
    stencil_numpy(u, out, rx, ry, scratch)


def stencil_numpy(u: np.ndarray, out: np.ndarray, rx: float, ry: float, scratch: np.ndarray) -> None:
    """The update strip by strip in numpy; ``scratch`` is (3, rows, ny) for any rows >= 1, so the
    three temporaries stay in L2 cache."""
    rows, cols = u.shape[0] - 2, u.shape[1] - 2
    chunk = max(1, min(rows, scratch.shape[1]))
    for i in range(1, rows + 1, chunk):
        j = min(i + chunk, rows + 1)
        two_c, tx, ty = scratch[0, : j - i, :cols], scratch[1, : j - i, :cols], scratch[2, : j - i, :cols]
        c = u[i:j, 1:-1]
        np.multiply(c, 2.0, out=two_c)
        np.add(u[i - 1 : j - 1, 1:-1], u[i + 1 : j + 1, 1:-1], out=tx)
        np.subtract(tx, two_c, out=tx)
        np.multiply(tx, rx, out=tx)
        np.add(u[i:j, :-2], u[i:j, 2:], out=ty)
        np.subtract(ty, two_c, out=ty)
        np.multiply(ty, ry, out=ty)
        inner = out[i:j, 1:-1]
        np.add(c, tx, out=inner)
        np.add(inner, ty, out=inner)


def make_scratch(cols: int) -> np.ndarray:
    return np.empty((3, max(1, CHUNK_CELLS // max(1, cols)), cols))


class Block:
    """One rank's part of the grid: its index range, two ghosted buffers, and its neighbours."""

    def __init__(self, comm: Any, grid: Grid) -> None:
        from mpi4py import MPI

        self.mpi = MPI
        self.grid = grid
        self.dims = MPI.Compute_dims(comm.Get_size(), [0, 0])
        if grid.nx < self.dims[0] or grid.ny < self.dims[1]:
            raise BadInput(f"a {grid.nx}x{grid.ny} grid cannot be split over {self.dims[0]}x{self.dims[1]} ranks")
        self.cart = comm.Create_cart(self.dims, periods=[False, False], reorder=False)
        self.rank = self.cart.Get_rank()
        cx, cy = self.cart.Get_coords(self.rank)
        (self.x0, self.x1), (self.y0, self.y1) = split(grid.nx, self.dims[0], cx), split(grid.ny, self.dims[1], cy)
        shape = (self.x1 - self.x0 + 2, self.y1 - self.y0 + 2)
        self.u, self.v = np.zeros(shape), np.zeros(shape)
        self.scratch = make_scratch(shape[1] - 2)
        self.north, self.south = self.cart.Shift(0, 1)
        self.west, self.east = self.cart.Shift(1, 1)
        self.col_send = np.empty((2, shape[0] - 2))
        self.col_recv = np.zeros((2, shape[0] - 2))

    @property
    def interior(self) -> np.ndarray:
        return self.u[1:-1, 1:-1]

    def exchange(self) -> None:
        """Fill the ghost layer from the four neighbours (PROC_NULL at the walls leaves it 0)."""
        u, send, recv = self.u, self.col_send, self.col_recv
        np.copyto(send[0], u[1:-1, 1])
        np.copyto(send[1], u[1:-1, -2])
        c = self.cart
        requests = [c.Irecv(u[0, 1:-1], self.north, 0), c.Irecv(u[-1, 1:-1], self.south, 1),
                    c.Irecv(recv[0], self.west, 2), c.Irecv(recv[1], self.east, 3),
                    c.Isend(u[-2, 1:-1], self.south, 0), c.Isend(u[1, 1:-1], self.north, 1),
                    c.Isend(send[1], self.east, 2), c.Isend(send[0], self.west, 3)]
        self.mpi.Request.Waitall(requests)
        if self.west != self.mpi.PROC_NULL:
            u[1:-1, 0] = recv[0]
        if self.east != self.mpi.PROC_NULL:
            u[1:-1, -1] = recv[1]

    def step(self) -> None:
        self.exchange()
        stencil(self.u, self.v, self.grid.rx, self.grid.ry, self.scratch)
        self.u, self.v = self.v, self.u

    def norm(self) -> float:
        local = float(np.einsum("ij,ij->", self.interior, self.interior))
        total = self.cart.allreduce(local, op=self.mpi.SUM)
        return math.sqrt(total * self.grid.hx * self.grid.hy)

    def any_flag(self, flag: bool) -> bool:
        return bool(self.cart.allreduce(int(flag), op=self.mpi.MAX))

    def gather(self) -> np.ndarray | None:
        """The global field on rank 0 (None elsewhere)."""
        pieces = self.cart.gather((self.x0, self.y0, self.interior.copy()), root=0)
        if pieces is None:
            return None
        full = np.empty((self.grid.nx, self.grid.ny))
        for x0, y0, part in pieces:
            full[x0 : x0 + part.shape[0], y0 : y0 + part.shape[1]] = part
        return full

    def scatter(self, full: np.ndarray | None) -> None:
        """Load this rank's part of a global field held by rank 0."""
        parts = None
        if self.rank == 0:
            parts = []
            for r in range(self.cart.Get_size()):
                cx, cy = self.cart.Get_coords(r)
                (a, b), (c, d) = split(self.grid.nx, self.dims[0], cx), split(self.grid.ny, self.dims[1], cy)
                parts.append(np.ascontiguousarray(full[a:b, c:d]))
        self.interior[...] = self.cart.scatter(parts, root=0)


@dataclass
class Run:
    """What rank 0 tracks across the time loop; ``series`` rows are (step, l2_norm)."""

    step: int = 0
    resumed_from: int | None = None
    series: list[tuple[int, float]] | None = None
    written: int = 0
    last_ckpt: int = -1
    ckpt_s: float = 0.0
    note: str = ""


def load_state(ctx: Context, block: Block) -> Run:
    """Resume from ckpt/state.npz when its grid key matches; else start from u0. Collective."""
    header: dict[str, Any] = {}
    full = None
    if block.rank == 0:
        header, full = _read_state(ctx, block.grid)
    header = block.cart.bcast(header, root=0)
    if header.get("step") is None:
        g = block.grid
        block.interior[...] = g.initial(block.x0, block.x1, block.y0, block.y1)
        return Run(series=[(0, g.exact_norm(0))], note=header.get("note", ""))
    block.scatter(full)
    return Run(step=header["step"], resumed_from=header["step"], series=header["series"], last_ckpt=header["step"])


def _read_state(ctx: Context, grid: Grid) -> tuple[dict[str, Any], np.ndarray | None]:
    path = ctx.ckpt_dir / STATE_FILE
    if not path.exists():
        return {}, None
    with np.load(path) as data:
        if str(data["key"]) != grid.key():
            return {"note": "checkpoint ignored: it was written for a different grid"}, None
        series = [(int(s), float(n)) for s, n in zip(data["series_step"], data["series_norm"], strict=True)]
        return {"step": int(data["step"]), "series": series}, np.array(data["field"])


def checkpoint(ctx: Context, block: Block, run: Run) -> None:
    """Gather the global field and write it with the step and series (collective; rank 0 writes)."""
    started = time.perf_counter()
    full = block.gather()
    if block.rank == 0:
        steps, norms = zip(*run.series, strict=True)

        def write(handle) -> None:
            np.savez(handle, field=full, step=run.step, key=block.grid.key(),
                     series_step=np.array(steps), series_norm=np.array(norms))

        save_checkpoint(ctx, STATE_FILE, write, marker=run.step, unit="step")
        run.written += 1
    run.last_ckpt = run.step
    run.ckpt_s += time.perf_counter() - started


def advance(ctx: Context, block: Block, run: Run, p: HeatParams, stop) -> bool:
    """Step to the end; return False when the ranks agreed to stop (after checkpointing)."""
    g = block.grid
    series_every = max(1, g.steps // SERIES_POINTS)
    poll_every = max(1, min(20, 2_000_000 // max(1, g.nx * g.ny // block.cart.Get_size())))
    while run.step < g.steps:
        if run.step % poll_every == 0 and block.any_flag(bool(stop)):
            if run.last_ckpt != run.step:
                checkpoint(ctx, block, run)
            return False
        block.step()
        run.step += 1
        if run.step % series_every == 0 or run.step == g.steps:
            norm = block.norm()
            run.series.append((run.step, norm))
        if run.step % p.checkpoint_every == 0 and run.step < g.steps:
            checkpoint(ctx, block, run)
    return True


def metrics(ctx: Context, block: Block, run: Run, *, started: int, compute_s: float, done: bool) -> dict:
    g = block.grid
    total = (read_progress(ctx.ckpt_dir) or {}).get("count", 0)
    ran = run.step - started
    return {
        "completed": done, "nx": g.nx, "ny": g.ny, "ranks": block.cart.Get_size(), "dims": list(block.dims),
        "steps": g.steps, "step": run.step, "dt": g.dt, "t_end": g.steps * g.dt, "alpha": g.alpha,
        "steps_this_attempt": ran, "compute_s": compute_s,
        "cells_per_second": g.nx * g.ny * ran / compute_s if compute_s > 0 else None,
        "checkpoints_written": run.written, "checkpoints_total": total, "checkpoint_every": ctx.params.get(
            "checkpoint_every"), "checkpoint_s": run.ckpt_s, "resumed_from_step": run.resumed_from,
        "compute_saved_fraction": (run.resumed_from or 0) / g.steps, "attempt": ctx.attempt, "note": run.note}


def finish(ctx: Context, block: Block, run: Run, m: dict) -> None:
    """Gather the final field; rank 0 adds the errors and writes field.npz, series.json, metrics."""
    full = block.gather()
    if block.rank != 0:
        return
    g = block.grid
    exact = g.exact(g.steps)
    diff = full - exact
    m["l2_error"] = math.sqrt(float(np.sum(diff * diff)) * g.hx * g.hy)
    m["rel_l2_error"] = m["l2_error"] / g.exact_norm(g.steps)
    m["max_error"] = float(np.abs(diff).max())
    m["l2_norm"] = run.series[-1][1]
    x, y = np.arange(1, g.nx + 1) * g.hx, np.arange(1, g.ny + 1) * g.hy
    atomic_write(ctx.out_dir / "field.npz", lambda h: np.savez_compressed(h, u=full, exact=exact, x=x, y=y,
                                                                       t=g.steps * g.dt))
    atomic_write_json(ctx.out_dir / "series.json", {
        "step": [s for s, _ in run.series], "t": [s * g.dt for s, _ in run.series],
        "l2_norm": [n for _, n in run.series], "analytic_l2_norm": [g.exact_norm(s) for s, _ in run.series]})
    write_metrics(ctx, m)


def main(ctx: Context) -> int:
    from mpi4py import MPI

    stop = install_stop_handler()
    p = HeatParams(**ctx.params)
    block = Block(MPI.COMM_WORLD, Grid.from_params(p))
    hosts = MPI.COMM_WORLD.allgather(MPI.Get_processor_name())
    run = load_state(ctx, block)
    block.exchange()  # only fills ghosts; sets up the connections before the clock starts
    block.any_flag(False)
    started, t0 = run.step, time.perf_counter()
    done = advance(ctx, block, run, p, stop)
    compute_s = time.perf_counter() - t0 - run.ckpt_s
    m = metrics(ctx, block, run, started=started, compute_s=compute_s, done=done)
    m["hosts"] = hosts
    if not done:
        if block.rank == 0:
            write_metrics(ctx, m)
            mark_preempted(ctx, run.step)
        return leaving(EXIT_PREEMPTED)
    finish(ctx, block, run, m)
    return leaving(EXIT_OK)


def leaving(code: int) -> int:
    """From here the rank only exits: a further stop signal is ignored. Python restores the default handlers
    while it finalizes, before mpi4py's MPI_Finalize, and under srun Slurm's SIGTERM can come twice (to the
    step, and forwarded by srun): the second one would kill a rank that has checkpointed, or finished, and
    turn its exit into a death by SIGTERM. An ignored signal stays ignored through finalization."""
    for signum in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(signum, signal.SIG_IGN)
    return code


if __name__ == "__main__":
    run_main(main)
