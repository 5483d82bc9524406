"""A webhook's signing secret, by its name: from Key Vault on Azure, from a local folder here. A manifest
names the secret and never holds it.

Azure: ``SecretClient(vault_url, DefaultAzureCredential()).get_secret(name).value`` (azure-keyvault-secrets;
the Function App's identity holds "Key Vault Secrets User" on the vault). Locally: the file
``<UPWELL_SECRETS_DIR>/<name>``, its text stripped of the final newline.
"""

from __future__ import annotations

from pathlib import Path

from upwell.errors import ConfigError, TransientError
from upwell.settings import Settings


def secret(name: str, settings: Settings) -> bytes:
    """The secret's bytes; ConfigError (permanent) when it does not exist or nothing is configured."""
    if settings.key_vault_url:
        return _from_vault(settings.key_vault_url, name)
    if not settings.secrets_dir:
        raise ConfigError(f"webhook secret {name!r}: neither UPWELL_KEY_VAULT_URL nor UPWELL_SECRETS_DIR is set")
    path = Path(settings.secrets_dir) / name
    try:
        return path.read_bytes().rstrip(b"\r\n")
    except OSError:
        raise ConfigError(f"webhook secret {name!r}: no file {path}") from None


def _from_vault(vault_url: str, name: str) -> bytes:
    from azure.core.exceptions import AzureError, ResourceNotFoundError
    from azure.identity import DefaultAzureCredential
    from azure.keyvault.secrets import SecretClient

    try:
        value = SecretClient(vault_url, DefaultAzureCredential()).get_secret(name).value
    except ResourceNotFoundError:
        raise ConfigError(f"webhook secret {name!r} is not in {vault_url}") from None
    except AzureError as exc:
        raise TransientError(f"webhook secret {name!r}: {type(exc).__name__}", code="KeyVault") from None
    return (value or "").encode()
