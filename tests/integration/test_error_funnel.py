"""The error funnel on real Azurite: Storage, Ledger and Lease raise only upwell errors, each with the
service's error code; the handlers drop permanent ones and raise transient ones."""

from __future__ import annotations

import uuid

import pytest
from azure.core.exceptions import HttpResponseError, ServiceRequestError

from handlers import context
from upwell.errors import Conflict, NotFound, StorageError, TransientError, UpwellError
from upwell.lease import Lease
from upwell.ledger import JobRow, Ledger
from upwell.storage import Storage, storage_error


@pytest.fixture()
def store(azurite) -> Storage:
    s = Storage(azurite.connection_string)
    s.ensure()
    return s


def test_storage_methods_raise_upwell_errors_with_the_code(store):
    with pytest.raises(NotFound) as err:
        store.read(f"results/nope-{uuid.uuid4().hex}.json")
    assert err.value.code == "BlobNotFound" and err.value.permanent and err.value.__cause__ is None
    with pytest.raises(NotFound) as err:
        store.read("no-such-container/x.json")
    assert err.value.code == "ContainerNotFound"
    with pytest.raises(NotFound):
        list(store.list("no-such-container"))
    with pytest.raises(NotFound) as err:
        store.send(f"no-such-queue-{uuid.uuid4().hex[:8]}", "x")
    assert err.value.code == "QueueNotFound"
    assert store.queue_length(f"no-such-queue-{uuid.uuid4().hex[:8]}") == 0


def test_ledger_raises_upwell_errors(azurite):
    ledger = Ledger(Storage(azurite.connection_string))
    ledger.table = Storage(azurite.connection_string).tables.get_table_client(f"missing{uuid.uuid4().hex[:8]}")
    with pytest.raises(NotFound) as err:
        ledger.create_job(JobRow(job_id="j"))
    assert err.value.code == "TableNotFound"
    ledger.catalog.table = ledger.table  # the job catalogue's table missing too: listings read it
    with pytest.raises(UpwellError):
        list(ledger.jobs())
    with pytest.raises(ValueError, match="not a terminal shard state"):
        ledger.finish_shard("j", "s", "running", {})


def test_lease_raises_upwell_errors(store):
    name = f"lease-{uuid.uuid4().hex[:8]}"
    queue = store.queue(name)
    queue.create_queue()
    try:
        queue.send_message("x")
        msg = queue.receive_message(visibility_timeout=30)
        lease = Lease(queue, msg, 30)
        lease.renew(force=True)
        stale = Lease(queue, msg, 30)  # the receipt that renew() replaced
        with pytest.raises(UpwellError) as err:
            stale.release(0)
        assert err.value.code  # the service said why (PopReceiptMismatch or MessageNotFound)
        lease.delete()
        lease.delete()  # already gone: fine
        lease.renew(force=True)  # settled: nothing to renew
    finally:
        queue.delete_queue()


@pytest.mark.parametrize("exc, kind, permanent", [
    (ServiceRequestError("connection refused"), TransientError, False),
    (HttpResponseError(message="busy", response=None), TransientError, False),
])
def test_storage_error_classifies(exc, kind, permanent):
    got = storage_error(exc, "read x")
    assert isinstance(got, kind) and got.permanent is permanent and "read x" in str(got)


def test_conflict_and_storage_error_are_permanent():
    assert Conflict("x").permanent and StorageError("x", code="AuthorizationFailure").code == "AuthorizationFailure"
    assert not TransientError("x").permanent


def test_handlers_drop_permanent_and_raise_transient_errors():
    def permanent():
        raise NotFound("gone", code="BlobNotFound")

    def transient():
        raise TransientError("busy", code="ServerBusy")

    assert context.settle("collect", permanent) is None
    with pytest.raises(TransientError):
        context.settle("collect", transient)
    assert context.settle("collect", lambda: 42) == 42
