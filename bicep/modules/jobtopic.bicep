// The custom topic that job events go to (upwell.after.notify): completed, failed, budget_exceeded
// and quarantined, as CloudEvents 1.0 (type io.upwell.job.<event>, subject jobs/<job id>, data the
// job's summary). A lab subscribes a Logic App, an email or a Teams flow to it, with no code.
// Publishing needs Microsoft Entra ID: local (key and SAS) auth is off, so no access key exists,
// and only the Function App's identity may send (EventGrid Data Sender on this topic alone).

param name string
param location string
param tags object

@description('Principal id of the Function App\'s user-assigned identity: the only publisher.')
param functionPrincipalId string

// EventGrid Data Sender: publish events to this topic, nothing else.
var eventGridDataSender = 'd5a91429-5739-47e2-a06b-3470a27159e7'

resource topic 'Microsoft.EventGrid/topics@2025-02-15' = {
  // checkov:skip=CKV_AZURE_193: The Flex Consumption app publishes over the public endpoint unless the private network is on; only Entra ID tokens of the one identity with EventGrid Data Sender are accepted (disableLocalAuth), TLS 1.2.
  name: name
  location: location
  tags: tags
  identity: {
    type: 'SystemAssigned'
  }
  properties: {
    inputSchema: 'CloudEventSchemaV1_0'
    disableLocalAuth: true
    minimumTlsVersionAllowed: '1.2'
    publicNetworkAccess: 'Enabled'
    dataResidencyBoundary: 'WithinRegion'
  }
}

resource sender 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(topic.id, functionPrincipalId, eventGridDataSender)
  scope: topic
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', eventGridDataSender)
    principalId: functionPrincipalId
    principalType: 'ServicePrincipal'
  }
}

output name string = topic.name
output endpoint string = topic.properties.endpoint
