// Two user-assigned identities: one for the Function App (control plane: storage,
// Batch, scale sets, container groups) and one for the worker nodes (data plane
// only: storage and image pulls). Keeping them apart means a compromised node
// cannot resize pools or create container groups.

@description('Name of the Function App identity.')
param functionIdentityName string

@description('Name of the worker (compute node) identity.')
param workerIdentityName string

param location string

@description('Tags applied to every resource (project, owner, environment, expiry).')
param tags object

resource functionIdentity 'Microsoft.ManagedIdentity/userAssignedIdentities@2024-11-30' = {
  name: functionIdentityName
  location: location
  tags: tags
}

resource workerIdentity 'Microsoft.ManagedIdentity/userAssignedIdentities@2024-11-30' = {
  name: workerIdentityName
  location: location
  tags: tags
}

output functionIdentityId string = functionIdentity.id
output functionIdentityName string = functionIdentity.name
output functionClientId string = functionIdentity.properties.clientId
output functionPrincipalId string = functionIdentity.properties.principalId
output workerIdentityId string = workerIdentity.id
output workerIdentityName string = workerIdentity.name
output workerClientId string = workerIdentity.properties.clientId
output workerPrincipalId string = workerIdentity.properties.principalId
