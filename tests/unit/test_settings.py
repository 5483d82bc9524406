"""Settings are read once from the environment; errors name the variable."""

import json

import pytest

from upwell.errors import ConfigError
from upwell.settings import Settings


def test_defaults_are_local():
    s = Settings.from_env({})
    assert set(s.pools) == {"cpu", "mpi", "gpu"} and all(p.backend == "local" for p in s.pools.values())
    assert s.max_shards == 100_000 and s.max_message_bytes == 64 * 1024


def test_identity_connection_forms():
    for key in ("AzureWebJobsStorage__serviceUri", "AzureWebJobsStorage__blobServiceUri",
                "AzureWebJobsStorage__accountName"):
        assert Settings.from_env({key: "x"}).connection == "identity"


def test_cloud_pools_take_account_wide_settings():
    env = {"UPWELL_POOLS": json.dumps({"gpu": {"backend": "batch", "options": {"pool_id": "p"}},
                                       "cpu": {"backend": "aci", "options": {"image": "mine:1"}},
                                       "loc": {"backend": "local"}}),
           "UPWELL_BATCH_ACCOUNT_URL": "https://acct.batch.azure.com", "UPWELL_WORKER_IMAGE_GPU": "acr/gpu:1",
           "UPWELL_WORKER_IMAGE_CPU": "acr/cpu:1", "UPWELL_WORKER_IDENTITY_ID": "/sub/id"}
    pools = Settings.from_env(env).pools
    assert pools["gpu"].options == {"pool_id": "p", "account_url": "https://acct.batch.azure.com",
                                    "identity_id": "/sub/id", "image": "acr/gpu:1"}
    assert pools["cpu"].options["image"] == "mine:1"  # a pool's own option wins
    assert pools["loc"].options == {}


@pytest.mark.parametrize("env, text", [
    ({"UPWELL_POOLS": "{nope"}, "UPWELL_POOLS is not valid JSON"),
    ({"UPWELL_POOLS": "{}"}, "non-empty"),
    ({"UPWELL_POOLS": json.dumps({"cpu": {"max_nodez": 2}})}, "unknown keys ['max_nodez']"),
    ({"UPWELL_MAX_SHARDS": "ten"}, "UPWELL_MAX_SHARDS must be an integer"),
    ({"UPWELL_MAX_UPLOAD_BYTES": "-1"}, "UPWELL_MAX_UPLOAD_BYTES must be >= 0"),
])
def test_errors_name_the_setting(env, text):
    with pytest.raises(ConfigError) as err:
        Settings.from_env(env)
    assert text in str(err.value)


def test_local_upwell_pools_changes_the_defaults_it_names_and_keeps_the_others():
    defaults = Settings.from_env({}).pools
    pools = Settings.from_env({"UPWELL_POOLS": json.dumps({"cpu": {"max_nodes": 3}})}).pools
    assert set(pools) == set(defaults) == {"cpu", "mpi", "gpu"}
    assert pools["cpu"].max_nodes == 3
    assert pools["cpu"].cooldown_s == defaults["cpu"].cooldown_s == 10.0  # not PoolSpec's 60 s
    assert pools["cpu"].price_key == defaults["cpu"].price_key
    assert pools["mpi"] == defaults["mpi"] and pools["gpu"] == defaults["gpu"]
    assert set(Settings.from_env({"UPWELL_POOLS": json.dumps({"gpu": None, "io": {"max_nodes": 1}})}).pools) == {
        "cpu", "mpi", "io"}
    with pytest.raises(ConfigError, match="leaves no pool"):
        Settings.from_env({"UPWELL_POOLS": json.dumps({"cpu": None, "mpi": None, "gpu": None})})


def test_a_cloud_pool_set_is_taken_whole():
    pools = Settings.from_env({"UPWELL_POOLS": json.dumps({"cpu": {"backend": "batch", "options": {"pool_id": "p"}}})})
    assert set(pools.pools) == {"cpu"} and pools.pools["cpu"].cooldown_s == 60.0


def _loaded_after(code: str) -> set[str]:
    """The upwell modules a fresh interpreter has loaded after running ``code``."""
    import subprocess
    import sys

    probe = f"{code}\nimport sys\nprint(' '.join(m for m in sys.modules if m.startswith('upwell')))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    return set(out.split())


def test_settings_import_no_backend():
    """Settings are data: the pools import settings, never the other way round."""
    loaded = _loaded_after("from upwell.settings import PoolSpec, Settings\nSettings.from_env({})")
    assert "upwell.settings" in loaded and not {m for m in loaded if m.startswith("upwell.pools")}


@pytest.mark.parametrize("connection", ["UseDevelopmentStorage=true", "identity"])
def test_storage_never_loads_the_local_stack(connection):
    """The Azure path (and the development shortcut, which the SDK clients resolve) loads nothing of upwell/local;
    the emulator's connection string lives there."""
    env = "{'AzureWebJobsStorage__serviceUri': 'https://a.blob.core.windows.net', " \
          "'AzureWebJobsStorage__credential': 'managedidentity'}"
    loaded = _loaded_after(f"from upwell.storage import Storage\ns = Storage({connection!r}, env={env})\n"
                           "assert s.blobs.url.startswith(('http://127.0.0.1:10000/devstoreaccount1', 'https://a.'))")
    assert "upwell.storage" in loaded and not {m for m in loaded if m.startswith("upwell.local")}
