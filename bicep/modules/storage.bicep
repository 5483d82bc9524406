// The pipeline's storage account: blob containers, queues (each with a -poison
// twin) and tables that upwell/names.py names, plus two infrastructure
// containers (the Flex Consumption deployment package and Event Grid's
// dead letters). Keys are off: every client authenticates with Entra ID.

param name string
param location string
param tags object

@description('Replication. ZRS keeps data through a zone outage at a small premium over LRS.')
@allowed([
  'Standard_LRS'
  'Standard_ZRS'
  'Standard_GRS'
  'Standard_GZRS'
  'Standard_RAGRS'
  'Standard_RAGZRS'
])
param skuName string = 'Standard_ZRS'

@description('Blob containers the code reads and writes (upwell/names.py CONTAINERS).')
param containerNames array

@description('Containers the platform needs but the code never names (deployment package, dead letters).')
param infraContainerNames array

@description('Queues, including the -poison twins (upwell/names.py ALL_QUEUES).')
param queueNames array

@description('Tables (upwell/names.py TABLES).')
param tableNames array

@description('Days that deleted blobs and containers stay recoverable.')
@minValue(1)
@maxValue(365)
param softDeleteDays int = 7

@description('Record every blob change in the change feed ($blobchangefeed), so the reconciler (UPWELL_RECONCILE_SOURCE=changefeed) reads only the changes since its last pass instead of listing incoming/.')
param changeFeedEnabled bool = false

@description('Days the change feed keeps its records (with changeFeedEnabled).')
@minValue(1)
@maxValue(146000)
param changeFeedRetentionDays int = 7

@description('When true, the public endpoint is closed; clients come in through private endpoints.')
param privateOnly bool = false

@description('Log Analytics workspace that receives the storage read/write/delete logs.')
param logAnalyticsId string

// Network access. Researchers upload from laptops with Storage Explorer, so the
// public endpoint stays open by default (Entra ID only, no keys, no SAS).
// privateOnly=true denies it to every network (defaultAction Deny, no IP or
// virtual-network rule) and the app and the workers come in through the private
// endpoints. Public network access stays Enabled even then, because Disabled
// refuses the trusted-service exception too, and Event Grid writes dead letters
// from outside the virtual network, through the public endpoint, as a trusted
// service with its system-assigned identity (Event Grid docs, dead-letter and
// retry policies, and storage queue as an event handler; behind a firewall only
// the system-assigned identity works, and only with the trusted services
// exception). Disabled would lose an undeliverable event instead of keeping it.
// The topic identity holds Blob Data Contributor on the dead-letter container
// alone (eventtopic.bicep).
resource storage 'Microsoft.Storage/storageAccounts@2025-08-01' = {
  // checkov:skip=CKV_AZURE_59: Public network access stays Enabled on purpose. By default researchers upload with Storage Explorer (Entra ID only); with enablePrivateNetwork every network is denied (defaultAction Deny) and Disabled would also refuse the trusted-service path that Event Grid dead letters take (CKV_UPW_6).
  // checkov:skip=CKV_AZURE_35: Researchers upload with Storage Explorer from their own networks, so the endpoint is public by default (Entra ID only: no keys, no SAS, no anonymous access). enablePrivateNetwork=true sets defaultAction Deny and adds private endpoints.
  // checkov:skip=CKV_AZURE_206: The default is ZRS (three zones in the region). Geo-replication roughly doubles the storage bill; results can be recomputed and inputs have an owner copy. storageSku allows GRS/GZRS/RA-GZRS.
  name: name
  location: location
  tags: tags
  kind: 'StorageV2'
  sku: {
    name: skuName
  }
  properties: {
    accessTier: 'Hot'
    allowBlobPublicAccess: false
    allowSharedKeyAccess: false
    allowCrossTenantReplication: false
    defaultToOAuthAuthentication: true
    minimumTlsVersion: 'TLS1_2'
    supportsHttpsTrafficOnly: true
    isLocalUserEnabled: false
    isSftpEnabled: false
    // Never Disabled, see the note above: Event Grid dead letters come through here.
    publicNetworkAccess: 'Enabled'
    networkAcls: {
      bypass: 'AzureServices'
      defaultAction: privateOnly ? 'Deny' : 'Allow'
      ipRules: []
      virtualNetworkRules: []
    }
    encryption: {
      keySource: 'Microsoft.Storage'
      requireInfrastructureEncryption: true
      services: {
        blob: {
          enabled: true
          keyType: 'Account'
        }
        file: {
          enabled: true
          keyType: 'Account'
        }
        queue: {
          enabled: true
          keyType: 'Account'
        }
        table: {
          enabled: true
          keyType: 'Account'
        }
      }
    }
  }
}

resource blobService 'Microsoft.Storage/storageAccounts/blobServices@2025-08-01' = {
  parent: storage
  name: 'default'
  properties: {
    deleteRetentionPolicy: {
      enabled: true
      days: softDeleteDays
    }
    containerDeleteRetentionPolicy: {
      enabled: true
      days: softDeleteDays
    }
    changeFeed: changeFeedEnabled ? {
      enabled: true
      retentionInDays: changeFeedRetentionDays
    } : {
      enabled: false
    }
  }
}

// No rule touches incoming/: a row-block or whole-file shard reads its bytes from the upload itself, at the
// ETag ingest pinned (upwell/shardref.py), for as long as the job runs or is re-run. A lifecycle filter can
// only include blobs (prefixMatch, blobIndexMatch), never exclude those an open job still reads, so the
// originals go with their job instead: `upwell delete` and `upwell prune` remove the upload with its rows.
@description('Days after its last change that a blob in each of these containers is deleted: results are kept longest, shards and checkpoints are scratch. The ledger rows go with `upwell prune`.')
param expireAfterDays object = {
  results: 180
  shards: 30
  checkpoints: 30
}

resource lifecycle 'Microsoft.Storage/storageAccounts/managementPolicies@2025-08-01' = {
  parent: storage
  name: 'default'
  properties: {
    policy: {
      rules: [for c in items(expireAfterDays): {
        name: 'expire-${c.key}'
        enabled: true
        type: 'Lifecycle'
        definition: {
          filters: {
            blobTypes: [
              'blockBlob'
            ]
            prefixMatch: [
              '${c.key}/'
            ]
          }
          actions: {
            baseBlob: {
              delete: {
                daysAfterModificationGreaterThan: c.value
              }
            }
          }
        }
      }]
    }
  }
}

resource containers 'Microsoft.Storage/storageAccounts/blobServices/containers@2025-08-01' = [for c in concat(containerNames, infraContainerNames): {
  parent: blobService
  name: c
  properties: {
    publicAccess: 'None'
  }
}]

resource queueService 'Microsoft.Storage/storageAccounts/queueServices@2025-08-01' = {
  parent: storage
  name: 'default'
}

resource queues 'Microsoft.Storage/storageAccounts/queueServices/queues@2025-08-01' = [for q in queueNames: {
  parent: queueService
  name: q
}]

resource tableService 'Microsoft.Storage/storageAccounts/tableServices@2025-08-01' = {
  parent: storage
  name: 'default'
}

resource tables 'Microsoft.Storage/storageAccounts/tableServices/tables@2025-08-01' = [for t in tableNames: {
  parent: tableService
  name: t
}]

// Read, write and delete logs for every service, so an investigation can say who
// touched which blob, message or ledger row.
resource blobLogs 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  name: 'storage-logs'
  scope: blobService
  properties: {
    workspaceId: logAnalyticsId
    logs: [
      {
        category: 'StorageRead'
        enabled: true
      }
      {
        category: 'StorageWrite'
        enabled: true
      }
      {
        category: 'StorageDelete'
        enabled: true
      }
    ]
  }
}

resource queueLogs 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  name: 'storage-logs'
  scope: queueService
  properties: {
    workspaceId: logAnalyticsId
    logs: [
      {
        category: 'StorageRead'
        enabled: true
      }
      {
        category: 'StorageWrite'
        enabled: true
      }
      {
        category: 'StorageDelete'
        enabled: true
      }
    ]
  }
}

resource tableLogs 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  name: 'storage-logs'
  scope: tableService
  properties: {
    workspaceId: logAnalyticsId
    logs: [
      {
        category: 'StorageRead'
        enabled: true
      }
      {
        category: 'StorageWrite'
        enabled: true
      }
      {
        category: 'StorageDelete'
        enabled: true
      }
    ]
  }
}

output name string = storage.name
output id string = storage.id
output blobEndpoint string = storage.properties.primaryEndpoints.blob
output queueEndpoint string = storage.properties.primaryEndpoints.queue
output tableEndpoint string = storage.properties.primaryEndpoints.table
