"""Whether a pool can run a shard's shape, said the same way at `upwell submit` and at ingest.

``check`` holds the shape against the pool with ``upwell.shape.check_pool`` (its checks are not repeated
here) and, where the pool runs one node per shard (GangUnsupported), names the configured pools that can
run the shard (the slurm and batch pools that ``check_pool`` passes), or says why none can. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping

from upwell import shape


def check(asked: shape.Shape, pools: Mapping, pool: str, where: str = "") -> None:
    """Raise upwell.shape's named error when ``pools[pool]`` cannot run ``asked``; ``where`` (an upload's
    name) prefixes its message."""
    lead = f"{where}: " if where else ""
    try:
        shape.check_pool(asked, pools[pool])
    except shape.GangUnsupported as exc:
        raise shape.GangUnsupported(f"{lead}{exc.message}; {gang_pools(asked, pools)}", field=exc.field,
                                    limit=exc.limit) from None
    except shape.InputRejected as exc:  # TooManyNodes, Oversubscribed: the same error, naming the upload
        if not where:
            raise
        raise type(exc)(f"{lead}{exc.message}", field=exc.field, limit=exc.limit) from None


def gang_pools(asked: shape.Shape, pools: Mapping) -> str:
    """Which configured pools can run a shard of ``asked`` of several nodes: the slurm and batch pools that
    ``shape.check_pool`` passes, or why none can."""
    gang = {name: spec for name, spec in sorted(pools.items()) if spec.backend in shape.GANG_BACKENDS}
    fit = []
    for name, spec in gang.items():
        try:
            shape.check_pool(asked, spec)
        except shape.InputRejected:
            continue
        fit.append(name)
    if fit:
        return f"pools that can run it: {', '.join(fit)} (set `pool:` in the manifest)"
    if gang:
        return (f"no configured pool can run it: the {'/'.join(shape.GANG_BACKENDS)} pools "
                f"({', '.join(gang)}) refuse it too")
    return f"no {' or '.join(shape.GANG_BACKENDS)} pool is configured (UPWELL_POOLS)"
