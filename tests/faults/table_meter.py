"""What the Table service reads to answer a client's calls, counted as Azure's documentation prices them.

"Design for querying" (learn.microsoft.com/azure/storage/tables/table-storage-design-for-query) names
four kinds of query: a *point query* (PartitionKey and RowKey) reads one entity; a *range query* (one
PartitionKey, a RowKey range) reads the entities in that range; a *partition scan* (one PartitionKey and a
filter on other properties) reads the whole partition; a *table scan* (no PartitionKey) reads every
entity of the table, however few it returns. Azurite answers all four alike, so a count of what came
back would hide a scan: ``Meter`` charges each call what the service would read, using an unmetered
client to size the partition or the table a scan reads.

Only calls made on the metering thread count (the devhost's timers run in threads of their own).
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

from upwell.storage import Storage

_PK = re.compile(r"PartitionKey eq @(\w+)")
_TERM = re.compile(r"(\w+) (eq|ne|gt|ge|lt|le) @")


class Meter:
    """Counts entities read per table (``reads``) by every table client that Storage hands out while
    ``installed`` (a monkeypatch of ``Storage.table``), on the thread that installed it."""

    def __init__(self) -> None:
        self.reads: Counter[str] = Counter()
        self.thread = threading.get_ident()
        self._raw = Storage.table

    def install(self, monkeypatch) -> Meter:
        raw, meter = self._raw, self

        def table(storage: Storage, name: str):
            return _Metered(raw(storage, name), name, meter)

        monkeypatch.setattr(Storage, "table", table)
        return self

    def reset(self) -> None:
        self.reads.clear()

    @property
    def total(self) -> int:
        return sum(self.reads.values())

    def add(self, table: str, n: int) -> None:
        if threading.get_ident() == self.thread:
            self.reads[table] += n


def scanned(client, flt: str, params: dict[str, Any]) -> int | None:
    """Entities a scan reads for this filter (a partition or the whole table); None for a point or range
    query, which reads only what it returns."""
    terms = set(_TERM.findall(flt))
    ranged = all(f == "PartitionKey" or (f == "RowKey" and op != "ne") for f, op in terms)  # 'ne' is no range
    pk = _PK.search(flt)
    if pk and ranged:
        return None
    where = {"query_filter": "PartitionKey eq @pk", "parameters": {"pk": params[pk.group(1)]}} if pk else {}
    if where:
        return sum(1 for _ in client.query_entities(select=["PartitionKey"], **where))
    return sum(1 for _ in client.list_entities(select=["PartitionKey"]))


class _Metered:
    """A TableClient that charges its reads to the meter; every other call passes through."""

    def __init__(self, client, name: str, meter: Meter):
        self._client, self._name, self._meter = client, name, meter

    def __getattr__(self, attr: str):
        return getattr(self._client, attr)

    def get_entity(self, *args, **kwargs):
        self._meter.add(self._name, 1)  # a point query
        return self._client.get_entity(*args, **kwargs)

    def list_entities(self, *args, **kwargs):
        self._meter.add(self._name, scanned(self._client, "", {}))  # a table scan
        return self._client.list_entities(*args, **kwargs)

    def query_entities(self, query_filter: str, *args, **kwargs):
        cost = scanned(self._client, query_filter, kwargs.get("parameters") or {})
        if cost is not None:
            self._meter.add(self._name, cost)
            return self._client.query_entities(query_filter, *args, **kwargs)
        return _Counted(self._client.query_entities(query_filter, *args, **kwargs),
                        lambda n: self._meter.add(self._name, n))


class _Counted:
    """A point or range query's pages: each entity is charged as the caller receives it."""

    def __init__(self, paged, add):
        self._paged, self._add = paged, add

    def _each(self, entities) -> Iterator:
        for entity in entities:
            self._add(1)
            yield entity

    def __iter__(self) -> Iterator:
        return self._each(self._paged)

    def by_page(self, *args, **kwargs) -> Iterator:
        for page in self._paged.by_page(*args, **kwargs):
            yield self._each(page)
