#!/bin/sh
# azd postdeploy hook (azure.yaml): create the Event Grid subscriptions that feed
# the blob-triggered functions (bicep/modules/events.bicep). Event Grid validates
# the webhook when a subscription is created, and the Functions host publishes
# its blobs_extension system key only once the code is running, so this runs
# after `azd deploy` and retries while the host starts. The key is read by ARM
# (listKeys in the template); it never passes through this script. Idempotent.
set -eu

: "${AZURE_RESOURCE_GROUP:?run azd provision first}"
: "${AZURE_FUNCTION_APP_NAME:?}" "${AZURE_FUNCTION_APP_HOST:?}" "${AZURE_STORAGE_ACCOUNT:?}"
: "${EVENTGRID_SYSTEM_TOPIC_NAME:?}" "${EVENTGRID_DEADLETTER_CONTAINER:?}" "${UPWELL_BLOB_TRIGGERS:?}"

here=$(cd "$(dirname "$0")" && pwd)
template="$here/../modules/events.bicep"

# Any request starts a Flex Consumption host that has scaled to zero.
curl -s -o /dev/null --max-time 60 "https://$AZURE_FUNCTION_APP_HOST/" || true

attempt=1
while ! az deployment group create --only-show-errors --output none \
    --resource-group "$AZURE_RESOURCE_GROUP" --name upwell-events --template-file "$template" \
    --parameters systemTopicName="$EVENTGRID_SYSTEM_TOPIC_NAME" functionAppName="$AZURE_FUNCTION_APP_NAME" \
                 storageAccountName="$AZURE_STORAGE_ACCOUNT" deadLetterContainerName="$EVENTGRID_DEADLETTER_CONTAINER" \
                 blobTriggers="$UPWELL_BLOB_TRIGGERS"; do
  if [ "$attempt" -ge 10 ]; then
    echo "postdeploy: the event subscriptions could not be created. Check that the functions are listed" \
         "(az functionapp function list -g $AZURE_RESOURCE_GROUP -n $AZURE_FUNCTION_APP_NAME) and run" \
         "./bicep/hooks/postdeploy.sh again." >&2
    exit 1
  fi
  echo "postdeploy: waiting for the Functions host and its blobs_extension key (attempt $attempt/10)"
  attempt=$((attempt + 1))
  sleep 30
done

# Later `azd provision` runs keep the subscriptions (main.bicep deploys events.bicep).
azd env set ENABLE_EVENT_SUBSCRIPTIONS true
echo "postdeploy: Event Grid delivers BlobCreated events to the blob-triggered functions"
