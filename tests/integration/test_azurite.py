"""The Azurite launcher: connection string, ports, clear errors, persistence, stop."""

from __future__ import annotations

import socket
import stat
from pathlib import Path

import pytest
from azure.data.tables import TableServiceClient
from azure.storage.blob import BlobServiceClient
from azure.storage.queue import QueueClient

from upwell.local.azurite import (
    ACCOUNT,
    Azurite,
    AzuriteError,
    AzuriteNotInstalled,
    connection_string,
    find_binary,
    free_ports,
    is_running,
    port_open,
    start_on_free_ports,
)


def test_connection_string_names_every_endpoint() -> None:
    text = connection_string(1, 2, 3)
    fields = dict(part.split("=", 1) for part in text.strip(";").split(";"))
    assert fields["AccountName"] == ACCOUNT == "devstoreaccount1"
    assert fields["BlobEndpoint"] == "http://127.0.0.1:1/devstoreaccount1"
    assert fields["QueueEndpoint"] == "http://127.0.0.1:2/devstoreaccount1"
    assert fields["TableEndpoint"] == "http://127.0.0.1:3/devstoreaccount1"
    assert fields["AccountKey"].endswith("==")


def test_free_ports_are_distinct_and_bindable() -> None:
    ports = free_ports(3)
    assert len(set(ports)) == 3
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_missing_binary_says_make_install(tmp_path: Path) -> None:
    with pytest.raises(AzuriteNotInstalled, match="run `make install`"):
        find_binary(tmp_path)
    assert find_binary().name == "azurite"  # the repository's own install is there


def _script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "fake-azurite"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def test_a_binary_that_exits_early_is_reported_with_its_log(tmp_path: Path) -> None:
    fake = _script(tmp_path, "echo 'EADDRINUSE or similar'; exit 3")
    emulator = Azurite(tmp_path / "data", *free_ports(3), binary=fake, startup_timeout=10)
    with pytest.raises(AzuriteError, match=r"exited with code 3(.|\n)*EADDRINUSE"):
        emulator.start()
    assert not emulator.running


def test_ports_that_never_open_time_out_and_the_process_is_stopped(tmp_path: Path) -> None:
    fake = _script(tmp_path, "exec sleep 30")
    emulator = Azurite(tmp_path / "data", *free_ports(3), binary=fake, startup_timeout=0.5)
    with pytest.raises(AzuriteError, match=r"did not open ports .* within 0.5 s"):
        emulator.start()
    assert emulator.process is None and not emulator.running


def test_fixture_azurite_serves_blob_queue_and_table(azurite: Azurite) -> None:
    assert azurite.running and is_running(azurite.ports)
    blobs = BlobServiceClient.from_connection_string(azurite.connection_string)
    container = blobs.get_container_client("azurite-check")
    container.create_container()
    container.upload_blob("a/b.txt", b"hello")
    assert container.download_blob("a/b.txt").readall() == b"hello"
    queue = QueueClient.from_connection_string(azurite.connection_string, "azurite-check")
    queue.create_queue()
    queue.send_message("m")
    assert [m.content for m in queue.receive_messages()] == ["m"]
    tables = TableServiceClient.from_connection_string(azurite.connection_string)
    table = tables.create_table("azuritecheck")
    table.upsert_entity({"PartitionKey": "p", "RowKey": "r", "v": 1})
    assert table.get_entity("p", "r")["v"] == 1


def test_busy_ports_are_refused_clearly(azurite: Azurite, tmp_path: Path) -> None:
    with pytest.raises(AzuriteError, match="already in use"):
        Azurite(tmp_path, *azurite.ports).start()


def test_data_persists_across_a_restart_and_stop_frees_the_ports(azurite: Azurite, tmp_path: Path) -> None:
    location = tmp_path / "data"
    with start_on_free_ports(location) as first:
        ports = first.ports
        container = BlobServiceClient.from_connection_string(first.connection_string).get_container_client("keep")
        container.create_container()
        container.upload_blob("x.json", b"{}")
    assert not any(port_open(p) for p in ports)
    with start_on_free_ports(location) as second:
        container = BlobServiceClient.from_connection_string(second.connection_string).get_container_client("keep")
        assert container.download_blob("x.json").readall() == b"{}"
