// The Key Vault that a user-subscription Batch account must reference, and where an
// operator keeps the labs' webhook signing secrets (upwell.after.secrets reads them by
// name). Access is RBAC only, soft delete and purge protection are on; the Batch service
// manages its own material, and the Function App's identity may only read secrets.

param name string
param location string
param tags object

@description('Object id of the "Microsoft Azure Batch" service principal in this tenant (app id ddbf3205-c6bd-46ae-8127-60eb93363864).')
param batchServicePrincipalObjectId string

@description('Principal id of the Function App\'s identity: reads webhook signing secrets by name.')
param functionPrincipalId string = ''

@description('Recover the soft-deleted vault of this name instead of creating one: after `azd down` the vault stays deleted, its name reserved, for softDeleteRetentionInDays, and purge protection forbids purging it, so a create would fail (bicep/hooks/preprovision.sh sets this).')
param recover bool = false

@description('Days a deleted vault stays recoverable (and its name reserved).')
@minValue(7)
@maxValue(90)
param softDeleteRetentionInDays int = 7

// Key Vault Secrets Officer: the Batch service keeps its own account material
// here in user-subscription mode and needs to set, get and delete secrets.
var keyVaultSecretsOfficer = 'b86a8fe4-44ce-4948-aee5-eccb2c155cd7'

// Key Vault Secrets User: the Function App reads a webhook's signing secret by name, and nothing else.
var keyVaultSecretsUser = '4633458b-17de-408a-b874-0445c86b69e6'

resource vault 'Microsoft.KeyVault/vaults@2025-05-01' = {
  // checkov:skip=CKV_AZURE_109: The Batch service (user-subscription mode) must reach this vault; the vault stores none of our secrets and allows only RBAC, with one role assignment (the Batch service principal).
  // checkov:skip=CKV_AZURE_189: Same reason as CKV_AZURE_109: the Batch service reaches the vault over its public endpoint.
  name: name
  location: location
  tags: tags
  properties: {
    tenantId: subscription().tenantId
    createMode: recover ? 'recover' : 'default'
    sku: {
      family: 'A'
      name: 'standard'
    }
    enableRbacAuthorization: true
    enableSoftDelete: true
    softDeleteRetentionInDays: softDeleteRetentionInDays
    enablePurgeProtection: true
    enabledForDeployment: false
    enabledForDiskEncryption: false
    enabledForTemplateDeployment: false
    publicNetworkAccess: 'Enabled'
    networkAcls: {
      bypass: 'AzureServices'
      defaultAction: 'Allow'
    }
  }
}

resource batchSecretsOfficer 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(batchServicePrincipalObjectId)) {
  name: guid(vault.id, batchServicePrincipalObjectId, keyVaultSecretsOfficer)
  scope: vault
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', keyVaultSecretsOfficer)
    principalId: batchServicePrincipalObjectId
    principalType: 'ServicePrincipal'
  }
}

resource functionSecretsUser 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(functionPrincipalId)) {
  name: guid(vault.id, functionPrincipalId, keyVaultSecretsUser)
  scope: vault
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', keyVaultSecretsUser)
    principalId: functionPrincipalId
    principalType: 'ServicePrincipal'
  }
}

output id string = vault.id
output name string = vault.name
output uri string = vault.properties.vaultUri
