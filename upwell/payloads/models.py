"""Parameter models for the registered payloads. Unknown fields are rejected.

A manifest's parameter grid is validated point by point against these models,
so a bad value is named with its field before anything is dispatched.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Params(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LogisticParams(Params):
    """The logistic map x <- r x (1 - x): a cheap, chaotic parameter sweep."""

    r: float = Field(3.5, ge=0.0, le=4.0)
    x0: float = Field(0.2, gt=0.0, lt=1.0)
    steps: int = Field(2000, ge=10, le=1_000_000)
    burn_in: int = Field(500, ge=0, le=1_000_000)
    sleep_s: float = Field(0.0, ge=0.0, le=600.0, description="simulated extra compute time")
    fail_first_attempts: int = Field(0, ge=0, le=100, description="fault injection: fail this many attempts")


class ChannelStatsParams(Params):
    """Per-channel statistics over a CSV shard of an instrument time series."""

    time_column: str = "time"


class WelchParams(Params):
    """Welch power spectrum per channel of a CSV shard."""

    time_column: str = "time"
    fs: float = Field(100.0, gt=0.0)
    nperseg: int = Field(256, ge=8, le=1 << 20)
    noverlap: int | None = Field(None, ge=0, description="samples shared by neighbouring segments (nperseg // 2)")

    @model_validator(mode="after")
    def _overlap_below_segment(self) -> WelchParams:
        if self.noverlap is not None and self.noverlap >= self.nperseg:
            raise ValueError(f"noverlap ({self.noverlap}) must be less than nperseg ({self.nperseg})")
        return self


class HeatParams(Params):
    """2-D heat equation on the unit square with a sinusoidal initial condition."""

    nx: int = Field(64, ge=8, le=8192)
    ny: int | None = Field(None, ge=8, le=8192)
    alpha: float = Field(1.0, gt=0.0)
    t_end: float = Field(0.01, gt=0.0)
    cfl: float = Field(0.2, gt=0.0, le=0.25)
    checkpoint_every: int = Field(100, ge=1)
    mode_x: int = Field(1, ge=1, le=64)
    mode_y: int = Field(1, ge=1, le=64)


class TrainParams(Params):
    """A small convolutional net on scikit-learn's handwritten digits."""

    epochs: int = Field(10, ge=1, le=500)
    lr: float = Field(0.05, gt=0.0, le=10.0)
    batch_size: int = Field(64, ge=1, le=4096)
    hidden: int = Field(64, ge=4, le=4096)
    momentum: float = Field(0.9, ge=0.0, lt=1.0)
    seed: int = Field(0, ge=0)
    optimizer: str = Field("sgd", pattern="^(sgd|adam)$")
    arch: str = Field("cnn", pattern="^(cnn|mlp)$", description="a small conv net, or a one-hidden-layer MLP")
    eval_every: int = Field(0, ge=0, le=500, description="evaluate on the test split every N epochs; 0: after "
                                                          "the last epoch only (the test pass costs ~10% of an epoch)")
    checkpoint_every: int = Field(1, ge=1, le=500, description="checkpoint every N epochs (and always on a stop "
                                                               "request); written in the background")
    checkpoint_interval_s: float = Field(
        30.0, ge=0.0, le=86400.0, description="and no sooner than this many seconds after the last checkpoint (0: "
        "at every checkpoint_every epochs). A stop request (a spot eviction's notice) and the last epoch always "
        "checkpoint; this bounds the work a crash without notice loses, at a bounded cost")
