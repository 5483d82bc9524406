// Event Grid subscriptions that deliver BlobCreated events to the functions they
// trigger, one per function, following the Flex Consumption Event Grid blob trigger
// sample. The endpoint is the blobs extension webhook for a blob trigger
// (source=EventGrid, `webhook: 'blobs'`) or the Event Grid extension webhook for an
// Event Grid trigger (`webhook: 'eventgrid'`); its `code` is the Functions *system*
// key `blobs_extension` or `eventgrid_extension`, read here with listKeys at deploy
// time so it never appears in code, settings or outputs.
// Those keys exist only after the function code is deployed, so only
// bicep/hooks/postdeploy.sh deploys this template, once the functions are listed
// and the key exists; main.bicep never does (tests/unit/test_bicep.py checks both).

param systemTopicName string
param functionAppName string
param storageAccountName string
param deadLetterContainerName string

@description('Blob-event triggers: [{ function, container, subjectEndsWith, webhook }]; the names must match the code (tests/unit/test_names_consistency.py).')
param blobTriggers array

resource topic 'Microsoft.EventGrid/systemTopics@2025-02-15' existing = {
  name: systemTopicName
}

resource site 'Microsoft.Web/sites@2025-03-01' existing = {
  name: functionAppName
}

resource storage 'Microsoft.Storage/storageAccounts@2025-08-01' existing = {
  name: storageAccountName
}

// The Functions host's system keys for the two extension webhooks (not storage keys).
var systemKeys = listKeys('${site.id}/host/default', '2025-03-01').systemKeys
var blobsEndpoint = 'https://${site.properties.defaultHostName}/runtime/webhooks/blobs'
var eventGridEndpoint = 'https://${site.properties.defaultHostName}/runtime/webhooks/eventgrid'

resource subscriptions 'Microsoft.EventGrid/systemTopics/eventSubscriptions@2025-02-15' = [for t in blobTriggers: {
  parent: topic
  name: 'blob-${t.function}'
  properties: {
    destination: {
      endpointType: 'WebHook'
      properties: {
        // The Event Grid extension names the function as it is; the blobs extension by its host id.
        endpointUrl: t.webhook == 'eventgrid' ? '${eventGridEndpoint}?functionName=${t.function}&code=${systemKeys.eventgrid_extension}' : '${blobsEndpoint}?functionName=Host.Functions.${t.function}&code=${systemKeys.blobs_extension}'
        maxEventsPerBatch: 1
        preferredBatchSizeInKilobytes: 64
      }
    }
    filter: {
      includedEventTypes: [
        'Microsoft.Storage.BlobCreated'
      ]
      subjectBeginsWith: '/blobServices/default/containers/${t.container}/'
      // A suffix match on the subject; '' matches all (Event Grid subscription schema).
      subjectEndsWith: t.subjectEndsWith
      enableAdvancedFilteringOnArrays: true
    }
    eventDeliverySchema: 'EventGridSchema'
    retryPolicy: {
      maxDeliveryAttempts: 30
      eventTimeToLiveInMinutes: 1440
    }
    // Nothing is lost: an event that cannot be delivered in 24 h is kept as a blob.
    deadLetterWithResourceIdentity: {
      identity: {
        type: 'SystemAssigned'
      }
      deadLetterDestination: {
        endpointType: 'StorageBlob'
        properties: {
          resourceId: storage.id
          blobContainerName: deadLetterContainerName
        }
      }
    }
  }
}]

output subscriptionNames array = [for t in blobTriggers: 'blob-${t.function}']
