// Every role assignment of the deployment, least privilege, scoped to the one
// resource that needs it. Each role definition id is the built-in role named in
// the comment above it (ids are the same in every tenant).

param storageAccountName string
param registryName string
param batchAccountName string
param applicationInsightsName string
param workerIdentityName string

@description('Principal id of the Function App identity (the control plane).')
param functionPrincipalId string

@description('Principal id of the worker identity (compute nodes).')
param workerPrincipalId string

param enableVmss bool = false
param vmssName string = ''
@description('Virtual network of the scale set (its NICs join the workers subnet on scale-out).')
param vnetName string = ''
param enableAci bool = false

@description('Optional: a person or group who uploads inputs and runs `upwell status`; empty for none.')
param deployerPrincipalId string = ''

@allowed([
  'User'
  'Group'
  'ServicePrincipal'
])
param deployerPrincipalType string = 'User'

@description('Optional: the operators who register payload definitions (upwell payload push); empty for none.')
param operatorPrincipalId string = ''

@allowed([
  'User'
  'Group'
  'ServicePrincipal'
])
param operatorPrincipalType string = 'Group'

@description('The container of registered payload definitions (upwell/names.py PAYLOADS).')
param payloadsContainerName string = 'payloads'

// Storage Blob Data Owner: the Functions host keeps blob-trigger receipts and
// its locks in azure-webjobs-hosts and reads the deployment package; handlers
// move rejected input to quarantine/.
var storageBlobDataOwner = 'b7e6dc6d-f1e8-4753-8033-0f276bb0955b'
// Storage Blob Data Contributor: workers read shards and write checkpoints/results.
var storageBlobDataContributor = 'ba92f5b4-2d11-453d-a403-e96b0029c9fe'
// Storage Queue Data Contributor: enqueue work, and (workers) update a message's
// visibility while a payload runs or at once on preemption, which the narrower
// Message Processor role (peek, receive, delete) does not allow.
var storageQueueDataContributor = '974c5e8b-45b9-4653-ba55-5f855dd0fb88'
// Storage Queue Data Reader: queue lengths for `upwell status`.
var storageQueueDataReader = '19e7f393-937e-4f77-808e-94535e297925'
// Storage Table Data Contributor: the ledger (jobs, and its index of open jobs: jobindex) and the scaler's state (scaling).
var storageTableDataContributor = '0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3'
// Storage Table Data Reader: the ledger for `upwell status`.
var storageTableDataReader = '76199698-9eea-4c19-bc75-cec21354c6b6'
// AcrPull: pull the worker images.
var acrPull = '7f951dda-4ed3-4680-a7ca-43fe172d538d'
// Monitoring Metrics Publisher: send telemetry with Entra ID (local auth is off).
var monitoringMetricsPublisher = '3913510d-42f4-4e42-8a64-420c390055eb'
// Azure Batch Data Contributor: resize pools and read node states through the
// Batch data plane, without rights to change or delete the account or list
// its keys (narrower than Contributor or Azure Batch Account Contributor).
var batchDataContributor = '6aaa78f1-f7de-44ca-8722-c64a23943cae'
// Managed Identity Operator: attach the worker identity to the container groups
// the scaler creates (userAssignedIdentities/*/assign/action), on that one identity.
var managedIdentityOperator = 'f1a07417-d97a-45cb-824c-7a7467783830'
// Virtual Machine Contributor: set the scale set's capacity and delete idle
// instances, on the one scale set.
var virtualMachineContributor = '9980e02c-c2be-4d73-94e8-173b1dc7cf3c'

// Reader: the janitor's scan (upwell/ops/janitor.py) lists disks, NICs, public IPs,
// VMs with their instance view, scale sets and every resource of the group; read
// only, on this resource group only.
var reader = 'acdd72a7-3385-48ef-bd42-f606fba81ae7'

resource storage 'Microsoft.Storage/storageAccounts@2025-08-01' existing = {
  name: storageAccountName
}

resource payloadsContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2025-08-01' existing = {
  name: '${storageAccountName}/default/${payloadsContainerName}'
}

// Payload definitions say what runs on the workers, so only operators write them. Every
// account-wide blob write role (the Function App, the workers, the uploaders) carries this
// ABAC condition: no write, add or delete of a blob in the payloads container. Reads stay.
var payloadsReadOnly = '((!(ActionMatches{\'Microsoft.Storage/storageAccounts/blobServices/containers/blobs/write\'}) AND !(ActionMatches{\'Microsoft.Storage/storageAccounts/blobServices/containers/blobs/add/action\'}) AND !(ActionMatches{\'Microsoft.Storage/storageAccounts/blobServices/containers/blobs/delete\'})) OR (@Resource[Microsoft.Storage/storageAccounts/blobServices/containers:name] StringNotEquals \'${payloadsContainerName}\'))'
var blobWriteRoles = [
  storageBlobDataOwner
  storageBlobDataContributor
]

resource registry 'Microsoft.ContainerRegistry/registries@2025-04-01' existing = {
  name: registryName
}

resource batch 'Microsoft.Batch/batchAccounts@2025-06-01' existing = {
  name: batchAccountName
}

resource appInsights 'Microsoft.Insights/components@2020-02-02' existing = {
  name: applicationInsightsName
}

resource workerIdentity 'Microsoft.ManagedIdentity/userAssignedIdentities@2024-11-30' existing = {
  name: workerIdentityName
}

resource scaleSet 'Microsoft.Compute/virtualMachineScaleSets@2024-11-01' existing = if (enableVmss) {
  name: vmssName
}

var functionStorageRoles = [
  storageBlobDataOwner
  storageQueueDataContributor
  storageTableDataContributor
]

// Workers hold Storage Blob Data Owner, not Contributor: the results, artifacts and checkpoints they write
// carry the blob index tag project=<name> (issue 27), and setting index tags is blobs/tags/write, which of
// the built-in data roles only Owner has. The payloadsReadOnly condition applies to it as to every write role.
var workerStorageRoles = [
  storageBlobDataOwner
  storageQueueDataContributor
  storageTableDataContributor
]

var deployerStorageRoles = [
  storageBlobDataContributor
  storageQueueDataReader
  storageTableDataReader
]

resource functionStorage 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for role in functionStorageRoles: {
  name: guid(storage.id, functionPrincipalId, role)
  scope: storage
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', role)
    principalId: functionPrincipalId
    principalType: 'ServicePrincipal'
    condition: contains(blobWriteRoles, role) ? payloadsReadOnly : null
    conditionVersion: contains(blobWriteRoles, role) ? '2.0' : null
  }
}]

resource workerStorage 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for role in workerStorageRoles: {
  name: guid(storage.id, workerPrincipalId, role)
  scope: storage
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', role)
    principalId: workerPrincipalId
    principalType: 'ServicePrincipal'
    condition: contains(blobWriteRoles, role) ? payloadsReadOnly : null
    conditionVersion: contains(blobWriteRoles, role) ? '2.0' : null
  }
}]

resource deployerStorage 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for role in deployerStorageRoles: if (!empty(deployerPrincipalId)) {
  name: guid(storage.id, deployerPrincipalId, role)
  scope: storage
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', role)
    principalId: deployerPrincipalId
    principalType: deployerPrincipalType
    condition: contains(blobWriteRoles, role) ? payloadsReadOnly : null
    conditionVersion: contains(blobWriteRoles, role) ? '2.0' : null
  }
}]

// Operators: Storage Blob Data Contributor on the payloads container only (push, and
// nothing else; the uploaders' role cannot write there, see payloadsReadOnly).
resource operatorPayloads 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(operatorPrincipalId)) {
  name: guid(payloadsContainer.id, operatorPrincipalId, storageBlobDataContributor)
  scope: payloadsContainer
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageBlobDataContributor)
    principalId: operatorPrincipalId
    principalType: operatorPrincipalType
  }
}

resource workerAcrPull 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(registry.id, workerPrincipalId, acrPull)
  scope: registry
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', acrPull)
    principalId: workerPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource functionTelemetry 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(appInsights.id, functionPrincipalId, monitoringMetricsPublisher)
  scope: appInsights
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', monitoringMetricsPublisher)
    principalId: functionPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource functionBatch 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(batch.id, functionPrincipalId, batchDataContributor)
  scope: batch
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', batchDataContributor)
    principalId: functionPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource functionAssignsWorker 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(workerIdentity.id, functionPrincipalId, managedIdentityOperator)
  scope: workerIdentity
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', managedIdentityOperator)
    principalId: functionPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource vnet 'Microsoft.Network/virtualNetworks@2025-09-01' existing = if (enableVmss) {
  name: vnetName
}

// Scale-out creates NICs in the workers subnet, which ARM authorises against the
// caller as subnets/join/action on the network: a custom role with only that,
// assigned on the one virtual network.
resource subnetJoinRole 'Microsoft.Authorization/roleDefinitions@2022-04-01' = if (enableVmss) {
  name: guid(resourceGroup().id, 'upwell-subnet-join')
  properties: {
    roleName: 'upwell subnet join (${resourceGroup().name})'
    description: 'Join the subnets of one virtual network (NICs of upwell scale set workers).'
    type: 'CustomRole'
    assignableScopes: [
      resourceGroup().id
    ]
    permissions: [
      {
        actions: [
          'Microsoft.Network/virtualNetworks/read'
          'Microsoft.Network/virtualNetworks/subnets/read'
          'Microsoft.Network/virtualNetworks/subnets/join/action'
        ]
        notActions: []
      }
    ]
  }
}

resource functionSubnetJoin 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (enableVmss) {
  name: guid(vnet.id, functionPrincipalId, 'upwell-subnet-join')
  scope: vnet
  dependsOn: [
    subnetJoinRole
  ]
  properties: {
    // A custom role is referenced by its subscription-level id, like a built-in one.
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', subnetJoinRole.name)
    principalId: functionPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource functionScaleSet 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (enableVmss) {
  name: guid(scaleSet.id, functionPrincipalId, virtualMachineContributor)
  scope: scaleSet
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', virtualMachineContributor)
    principalId: functionPrincipalId
    principalType: 'ServicePrincipal'
  }
}

// Container groups: no built-in role is narrower than Contributor on the resource
// group, so a custom role grants exactly what the scaler's ACI backend does
// (create, read, delete container groups; join the ACI subnet when private),
// assignable only in this resource group.
resource aciOperatorRole 'Microsoft.Authorization/roleDefinitions@2022-04-01' = if (enableAci) {
  name: guid(resourceGroup().id, 'upwell-container-groups-operator')
  properties: {
    roleName: 'upwell container groups operator (${resourceGroup().name})'
    description: 'Create, read and delete Azure Container Instances groups in one resource group (upwell scaler).'
    type: 'CustomRole'
    assignableScopes: [
      resourceGroup().id
    ]
    permissions: [
      {
        actions: [
          'Microsoft.ContainerInstance/containerGroups/read'
          'Microsoft.ContainerInstance/containerGroups/write'
          'Microsoft.ContainerInstance/containerGroups/delete'
          'Microsoft.ContainerInstance/containerGroups/stop/action'
          'Microsoft.ContainerInstance/containerGroups/containers/logs/read'
          'Microsoft.Network/virtualNetworks/subnets/join/action'
          'Microsoft.Resources/subscriptions/resourceGroups/read'
        ]
        notActions: []
      }
    ]
  }
}

resource functionAci 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (enableAci) {
  name: guid(resourceGroup().id, functionPrincipalId, 'upwell-container-groups-operator')
  dependsOn: [
    aciOperatorRole
  ]
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', aciOperatorRole.name)
    principalId: functionPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource functionGroupReader 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(resourceGroup().id, functionPrincipalId, reader)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', reader)
    principalId: functionPrincipalId
    principalType: 'ServicePrincipal'
  }
}

// The janitor's actions when applied (Janitor._act): delete unattached disks, NICs
// and public IPs; deallocate stopped VMs; scale idle scale sets to 0; delete expired
// resources of the types it knows (janitor.DELETE_API). No built-in role is narrower
// than Contributor on the group for this set, so a custom role lists exactly these.
resource janitorRole 'Microsoft.Authorization/roleDefinitions@2022-04-01' = {
  name: guid(resourceGroup().id, 'upwell-janitor')
  properties: {
    roleName: 'upwell janitor (${resourceGroup().name})'
    description: 'Delete leaked disks, NICs and IPs, deallocate stopped VMs, scale idle scale sets to 0 and delete expired upwell resources in one resource group.'
    type: 'CustomRole'
    assignableScopes: [
      resourceGroup().id
    ]
    permissions: [
      {
        actions: [
          'Microsoft.Compute/disks/delete'
          'Microsoft.Compute/snapshots/delete'
          'Microsoft.Compute/virtualMachines/deallocate/action'
          'Microsoft.Compute/virtualMachines/delete'
          'Microsoft.Compute/virtualMachineScaleSets/write'
          'Microsoft.Compute/virtualMachineScaleSets/delete'
          'Microsoft.Network/networkInterfaces/delete'
          'Microsoft.Network/publicIPAddresses/delete'
          'Microsoft.ContainerInstance/containerGroups/delete'
        ]
        notActions: []
      }
    ]
  }
}

resource functionJanitor 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(resourceGroup().id, functionPrincipalId, 'upwell-janitor')
  dependsOn: [
    janitorRole
  ]
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', janitorRole.name)
    principalId: functionPrincipalId
    principalType: 'ServicePrincipal'
  }
}
