"""The payload processes: one module per built-in payload definition, plus their shared helpers.

``PRELOAD`` is what the warm runner (``workers.forkserver``) imports once before it forks a shard: the
payload modules whose definitions launch them plain (one Python process; torch stays out, it would
double the runner's start-up for the shards that do not train), their shared helpers and what they
import lazily (scipy.signal alone is about 0.6 s of a welch shard's 1.5 s). This module imports nothing.
"""

PRELOAD = ("numpy", "pydantic", "upwell.payloads.models", "upwell.payloads.builtin", "workers.payloads.common",
           "workers.payloads.logistic", "workers.payloads.channel_stats", "workers.payloads.welch",
           "scipy.signal", "pyarrow.csv")
