#!/bin/sh
# Pin the pools' worker images by digest (run by postdeploy.sh; run it again after `az acr build`).
#
# main.bicep names the worker images by tag (upwell-mpi:<imageTag>, upwell-gpu:<imageTag>). A tag can
# move, and a result must record the image that really ran: this asks the registry for each tag's digest
# (az acr repository show --image <repo>:<tag>, the registry's Tag - Get Properties) and sets the Function
# App's UPWELL_WORKER_IMAGE_CPU/GPU to <registry>/<repo>@sha256:<digest>. The pools then pull that exact
# image and tell their agents its digest (UPWELL_IMAGE_DIGEST), which every result's provenance records.
# An image that is not pushed yet keeps its tag and is named; nothing fails. A provision puts the tags
# back; the postdeploy hook that follows pins them again.
set -eu

: "${AZURE_RESOURCE_GROUP:?run azd provision first}"
: "${AZURE_FUNCTION_APP_NAME:?}" "${AZURE_CONTAINER_REGISTRY_NAME:?}" "${AZURE_CONTAINER_REGISTRY_ENDPOINT:?}"

here=$(cd "$(dirname "$0")" && pwd)
tag=${UPWELL_IMAGE_TAG:-latest}
settings=""
for pair in UPWELL_WORKER_IMAGE_CPU=upwell-mpi UPWELL_WORKER_IMAGE_GPU=upwell-gpu; do
  name=${pair%%=*}
  repo=${pair#*=}
  if answer=$(az acr repository show --name "$AZURE_CONTAINER_REGISTRY_NAME" --image "$repo:$tag" -o json 2>/dev/null) &&
     image=$(printf '%s' "$answer" | python3 "$here/../tools/image_digest.py" "$AZURE_CONTAINER_REGISTRY_ENDPOINT/$repo"); then
    settings="$settings $name=$image"
    echo "imagedigest: $name=$image"
  else
    echo "imagedigest: $repo:$tag is not in $AZURE_CONTAINER_REGISTRY_NAME yet: build it (docs/deploy.md," \
         "\"Build and push the worker images\") and run ./bicep/hooks/imagedigest.sh again" >&2
  fi
done

if [ -n "$settings" ]; then
  # shellcheck disable=SC2086 # one NAME=VALUE word per image
  az functionapp config appsettings set --only-show-errors --output none \
    --resource-group "$AZURE_RESOURCE_GROUP" --name "$AZURE_FUNCTION_APP_NAME" --settings $settings
fi
