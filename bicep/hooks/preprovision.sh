#!/bin/sh
# azd preprovision hook (azure.yaml). Idempotent; needs the az CLI, logged in to
# the same tenant and subscription as azd (az login; az account set -s <id>).
#  1. registers the resource providers the templates use (a no-op when done);
#  2. finds the object id of the "Microsoft Azure Batch" service principal in this
#     tenant (the same app id everywhere) for user-subscription mode;
#  3. defaults the owner tag to the signed-in user;
#  4. makes the Batch pools' user password once per environment (a secret kept in
#     the azd environment, passed as a @secure() parameter);
#  5. asks for the environment's Key Vault to be recovered when `azd down` left it
#     soft-deleted: purge protection keeps its name reserved, so creating it again
#     would fail;
#  6. makes the Entra ID app registration that the Function App's built-in authentication
#     signs people in with (once per environment: UPWELL_AUTH_CLIENT_ID; docs/access.md).
set -eu

command -v az >/dev/null 2>&1 || { echo "preprovision: the az CLI is required (docs/deploy.md)" >&2; exit 1; }

for ns in Microsoft.Batch Microsoft.Web Microsoft.App Microsoft.Storage Microsoft.EventGrid \
          Microsoft.ContainerRegistry Microsoft.ContainerInstance Microsoft.KeyVault Microsoft.ManagedIdentity \
          Microsoft.OperationalInsights Microsoft.Insights Microsoft.Consumption Microsoft.Compute Microsoft.Network; do
  state=$(az provider show --namespace "$ns" --query registrationState -o tsv 2>/dev/null || echo NotRegistered)
  if [ "$state" != "Registered" ]; then
    echo "preprovision: registering $ns"
    az provider register --namespace "$ns" --only-show-errors >/dev/null
  fi
done

if [ -z "${BATCH_SERVICE_PRINCIPAL_OBJECT_ID:-}" ]; then
  # "Microsoft Azure Batch" has this application id in every tenant.
  sp=$(az ad sp show --id ddbf3205-c6bd-46ae-8127-60eb93363864 --query id -o tsv 2>/dev/null || true)
  if [ -z "$sp" ]; then
    echo "preprovision: the Microsoft Azure Batch service principal was not found; registering Microsoft.Batch" \
         "creates it. Re-run when 'az ad sp show --id ddbf3205-c6bd-46ae-8127-60eb93363864' answers." >&2
    exit 1
  fi
  azd env set BATCH_SERVICE_PRINCIPAL_OBJECT_ID "$sp"
fi

if [ -z "${UPWELL_OWNER:-}" ]; then
  who=$(az ad signed-in-user show --query userPrincipalName -o tsv 2>/dev/null || az account show --query user.name -o tsv)
  azd env set UPWELL_OWNER "$who"
  echo "preprovision: owner tag set to $who (azd env set UPWELL_OWNER <owner> to change it)"
fi

if [ -z "${UPWELL_BATCH_USER_PASSWORD:-}" ]; then
  # 32 random characters, and one of each class for any password rule; never printed.
  pw="$(head -c 48 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' | head -c 32)Aa1-"
  azd env set UPWELL_BATCH_USER_PASSWORD "$pw"
  echo "preprovision: made the Batch pools' user password (kept in the azd environment)"
fi

# The vault this environment deployed last (an azd output), else any upwell vault of its resource group.
recover=false
if [ -n "${AZURE_KEY_VAULT_NAME:-}" ]; then
  if az keyvault show-deleted --name "$AZURE_KEY_VAULT_NAME" --query name -o tsv >/dev/null 2>&1; then
    recover=true
  fi
else
  rg="${AZURE_RESOURCE_GROUP:-rg-upwell-${AZURE_ENV_NAME:-}}"
  if az keyvault list-deleted --resource-type vault --query "[?starts_with(name, 'kv-upw-')].properties.vaultId" \
       -o tsv 2>/dev/null | grep -qi "/resourceGroups/$rg/"; then
    recover=true
  fi
fi
azd env set UPWELL_KEY_VAULT_RECOVER "$recover"
if [ "$recover" = true ]; then
  echo "preprovision: the environment's Key Vault is soft-deleted (azd down); this provision recovers it"
fi

if [ -z "${UPWELL_AUTH_CLIENT_ID:-}" ]; then
  # Sign-in for the dashboard and the API: ID tokens for the browser flow, api://<client id> for API callers.
  # The redirect URI needs the app's host name, so postdeploy adds it.
  app=$(az ad app create --display-name "upwell-${AZURE_ENV_NAME:-env}" --sign-in-audience AzureADMyOrg \
          --enable-id-token-issuance true --query appId -o tsv)
  az ad app update --id "$app" --identifier-uris "api://$app"
  azd env set UPWELL_AUTH_CLIENT_ID "$app"
  echo "preprovision: made the sign-in app registration $app (UPWELL_AUTH_CLIENT_ID)"
fi
