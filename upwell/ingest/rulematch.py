"""Which pipeline rule an instrument drop falls under: the first in pipelines/ that loads and matches.

A rule file that does not load is logged and passed over; no match at all is bad input.
"""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor

from upwell import logs, names
from upwell.errors import InputRejected
from upwell.ingest import manifests
from upwell.payloads.registry import Registry
from upwell.storage import Storage

log = logs.get("upwell.ingest.rulematch")


def match_rule(storage: Storage, definitions: Registry, name: str,
               reads: ThreadPoolExecutor | None = None) -> manifests.PipelineRule:
    """The first rule, in listing order, that loads and matches ``name``. With ``reads``, the payload names
    and the listing are read at once and the rule files a few ahead (errors as one by one: a file after the
    match is never looked at)."""
    known_f = reads.submit(definitions.names) if reads is not None else None
    items = [i.name for i in storage.list(names.PIPELINES) if i.name.endswith((".yaml", ".yml", ".json"))]
    rules, known = [], known_f.result() if known_f is not None else definitions.names()
    for item, data in _ahead(reads, lambda n: storage.read(f"{names.PIPELINES}/{n}"), items):
        try:
            rule = manifests.load_rule(data(), f"{names.PIPELINES}/{item}", known)
        except InputRejected as exc:
            log.warning("ingest.bad_rule", rule=item, error=exc.message)
            continue
        rules.append(rule)
        if rule.matches(name):
            return rule
    known = ", ".join(r.match for r in rules) or "none"
    raise InputRejected(f"no pipeline rule matches incoming/{name} (rules: {known}), and it is not a job "
                        f"manifest (job.yaml / job.json)", field="name")


def _ahead(pool: ThreadPoolExecutor | None, read, items: list[str], depth: int = 4):
    """(item, result getter) in order; with ``pool``, up to ``depth`` reads run ahead of the caller."""
    if pool is None:
        for item in items:
            yield item, functools.partial(read, item)
        return
    futures = [pool.submit(read, item) for item in items[:depth]]
    for k, item in enumerate(items):
        if k + depth < len(items):
            futures.append(pool.submit(read, items[k + depth]))
        yield item, futures[k].result
