// The Event Grid system topic on the storage account. Its own identity may write
// dead letters to one container and nothing else. The subscriptions that feed
// the blob-triggered functions live in events.bicep: they need the function
// code to be deployed first (see docs/deploy.md).

param name string
param location string
param tags object
param storageAccountName string
param deadLetterContainerName string

// Storage Blob Data Contributor: Event Grid writes undeliverable events as blobs.
var storageBlobDataContributor = 'ba92f5b4-2d11-453d-a403-e96b0029c9fe'

resource storage 'Microsoft.Storage/storageAccounts@2025-08-01' existing = {
  name: storageAccountName
}

resource blobService 'Microsoft.Storage/storageAccounts/blobServices@2025-08-01' existing = {
  parent: storage
  name: 'default'
}

resource deadLetterContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2025-08-01' existing = {
  parent: blobService
  name: deadLetterContainerName
}

resource topic 'Microsoft.EventGrid/systemTopics@2025-02-15' = {
  name: name
  location: location
  tags: tags
  identity: {
    type: 'SystemAssigned'
  }
  properties: {
    source: storage.id
    topicType: 'Microsoft.Storage.StorageAccounts'
  }
}

resource deadLetterWriter 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(deadLetterContainer.id, topic.id, storageBlobDataContributor)
  scope: deadLetterContainer
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageBlobDataContributor)
    principalId: topic.identity.principalId
    principalType: 'ServicePrincipal'
  }
}

output name string = topic.name
output principalId string = topic.identity.principalId
