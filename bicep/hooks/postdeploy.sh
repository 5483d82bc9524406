#!/bin/sh
# azd postdeploy hook (azure.yaml): create the Event Grid subscriptions that feed
# the blob-triggered functions (bicep/modules/events.bicep). This is the only
# place they are created: main.bicep never deploys them, so a provision into an
# empty resource group cannot create a subscription before the code exists.
#
# Event Grid validates the webhook when a subscription is created, and the
# Functions host creates its blobs_extension and eventgrid_extension system keys
# only once the code is running. So this waits until (1) every function that blob
# events trigger is listed and (2) both keys exist, and only then deploys the
# template. The keys are read by ARM
# (listKeys in the template); this script only asks whether it exists and never
# sees its value. Idempotent: run it again after any re-provision.
set -eu

: "${AZURE_RESOURCE_GROUP:?run azd provision first}"
: "${AZURE_FUNCTION_APP_NAME:?}" "${AZURE_FUNCTION_APP_HOST:?}" "${AZURE_STORAGE_ACCOUNT:?}"
: "${EVENTGRID_SYSTEM_TOPIC_NAME:?}" "${EVENTGRID_DEADLETTER_CONTAINER:?}" "${UPWELL_BLOB_TRIGGERS:?}"

here=$(cd "$(dirname "$0")" && pwd)
template="$here/../modules/events.bicep"
attempts=${UPWELL_POSTDEPLOY_ATTEMPTS:-10}
pause=${UPWELL_POSTDEPLOY_WAIT_S:-30}

# The function names from the UPWELL_BLOB_TRIGGERS output ([{function, container}, ...]).
functions=$(printf '%s' "$UPWELL_BLOB_TRIGGERS" | tr ',{}' '\n\n\n' | sed -n 's/.*"function" *: *"\([^"]*\)".*/\1/p')
[ -n "$functions" ] || { echo "postdeploy: UPWELL_BLOB_TRIGGERS names no function: $UPWELL_BLOB_TRIGGERS" >&2; exit 1; }

# Succeeds when the code is deployed: every function that blob events trigger is
# listed and both system keys exist (asked as yes/no, never printed).
code_ready() {
  listed=$(az functionapp function list -g "$AZURE_RESOURCE_GROUP" -n "$AZURE_FUNCTION_APP_NAME" \
             --query "[].name" -o tsv 2>/dev/null) || return 1
  for fn in $functions; do
    printf '%s\n' "$listed" | grep -qx "$AZURE_FUNCTION_APP_NAME/$fn" || { echo "postdeploy: $fn is not listed yet"; return 1; }
  done
  for key in blobs_extension eventgrid_extension; do
    has_key=$(az functionapp keys list -g "$AZURE_RESOURCE_GROUP" -n "$AZURE_FUNCTION_APP_NAME" \
                --query "systemKeys.$key != null" -o tsv 2>/dev/null) || return 1
    [ "$has_key" = "true" ] || { echo "postdeploy: the $key key does not exist yet"; return 1; }
  done
}

attempt=1
while :; do
  # Any request starts a Flex Consumption host that has scaled to zero.
  curl -s -o /dev/null --max-time 60 "https://$AZURE_FUNCTION_APP_HOST/" || true
  if code_ready && az deployment group create --only-show-errors --output none \
      --resource-group "$AZURE_RESOURCE_GROUP" --name upwell-events --template-file "$template" \
      --parameters systemTopicName="$EVENTGRID_SYSTEM_TOPIC_NAME" functionAppName="$AZURE_FUNCTION_APP_NAME" \
                   storageAccountName="$AZURE_STORAGE_ACCOUNT" deadLetterContainerName="$EVENTGRID_DEADLETTER_CONTAINER" \
                   blobTriggers="$UPWELL_BLOB_TRIGGERS"; then
    break
  fi
  if [ "$attempt" -ge "$attempts" ]; then
    echo "postdeploy: the event subscriptions could not be created. Check that the functions are listed" \
         "(az functionapp function list -g $AZURE_RESOURCE_GROUP -n $AZURE_FUNCTION_APP_NAME) and run" \
         "./bicep/hooks/postdeploy.sh again." >&2
    exit 1
  fi
  echo "postdeploy: waiting for the Functions host and its extension keys (attempt $attempt/$attempts)"
  attempt=$((attempt + 1))
  sleep "$pause"
done

echo "postdeploy: Event Grid delivers BlobCreated events to the functions they trigger"
echo "postdeploy: blobs uploaded before now had no event; the reconciler picks them up"

# The sign-in app registration (preprovision) gets the deployed app's callback for built-in authentication.
if [ -n "${UPWELL_AUTH_CLIENT_ID:-}" ]; then
  az ad app update --id "$UPWELL_AUTH_CLIENT_ID" \
    --web-redirect-uris "https://$AZURE_FUNCTION_APP_HOST/.auth/login/aad/callback" --only-show-errors
  echo "postdeploy: sign-in redirects to https://$AZURE_FUNCTION_APP_HOST/.auth/login/aad/callback"
fi

# The pools' worker images by digest, so that results record the image that really ran (imagedigest.sh).
"$here/imagedigest.sh" || echo "postdeploy: the worker images are not pinned by digest; run" \
  "./bicep/hooks/imagedigest.sh once they are built" >&2
