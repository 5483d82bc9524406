"""Cost in one package: what upwell's compute costs, before, during and after a job.

- ``prices``: the dated price table that ships with the code (``prices.json``; ``upwell prices``
  refreshes it) and prices per node-hour, blended over a spot share, per share of a node;
- ``forecast``: the estimate before dispatch, node time learned from earlier results;
- ``accounting``: node-seconds x price per shard, and per job, owner and project (``upwell cost``);
- ``budgets``: what is left of a budget, and the owner and project budgets checked at ingest;
- ``wallclock``: the kill switches, a job's and an attempt's maximum wall-clock;
- ``tags``: the project, owner and expiry tags on every Azure resource, which cost reports group by
  and the janitor reads.

The CLI (``upwell cost``, ``upwell prices``), the reports and the dashboard only present these.
The names below are the price table's and the per-shard figures' API, as ``from upwell import cost``
reads them (``cost.load()``, ``cost.breakdown(rows)``).
"""

from upwell.cost.accounting import CostLine, actual, breakdown, paid_seconds, row_key, shard_usd, to_float, truthy
from upwell.cost.budgets import remaining
from upwell.cost.prices import (
    DEFAULT_KEY,
    Price,
    PriceTable,
    Services,
    blended_per_hour,
    default_path,
    estimate,
    load,
    node_share,
    parse,
    price,
)

__all__ = [
    "DEFAULT_KEY", "CostLine", "Price", "PriceTable", "Services", "actual", "blended_per_hour",
    "breakdown", "default_path", "estimate", "load", "node_share", "paid_seconds", "parse", "price",
    "remaining", "row_key", "shard_usd", "to_float", "truthy",
]
