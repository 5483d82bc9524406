// A deliberately bad template: tests/unit/test_bicep.py runs upwell's custom checkov
// checks (bicep/checks) on this folder and expects each of them to fail.

param location string = resourceGroup().location
param publicAccess bool = true

var tags = {
  project: 'upwell'
  owner: 'someone'
  environment: 'dev'
}

// CKV_UPW_1 (public blobs), CKV_UPW_2 (shared keys), CKV_UPW_3 (old TLS),
// CKV_UPW_4 (no expiry tag) and CKV_UPW_6 (public access disabled, no trusted
// services: Event Grid's dead letters are refused) all fail here.
resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' = {
  name: 'stupwellbad'
  location: location
  tags: tags
  kind: 'StorageV2'
  sku: {
    name: 'Standard_LRS'
  }
  properties: {
    allowBlobPublicAccess: publicAccess
    allowSharedKeyAccess: true
    minimumTlsVersion: 'TLS1_0'
    publicNetworkAccess: 'Disabled'
    networkAcls: {
      bypass: 'None'
      defaultAction: 'Deny'
    }
  }
}

// CKV_UPW_5: shared-key authentication on the Batch data plane.
resource batch 'Microsoft.Batch/batchAccounts@2024-07-01' = {
  name: 'baupwellbad'
  location: location
  tags: union(tags, {
    expiry: '2030-01-01'
  })
  properties: {
    allowedAuthenticationModes: [
      'AAD'
      'SharedKey'
    ]
  }
}

// CKV_UPW_7: purge protection and a fixed name, and no way back after azd down.
resource vault 'Microsoft.KeyVault/vaults@2023-07-01' = {
  name: 'kv-upwell-bad'
  location: location
  tags: union(tags, {
    expiry: '2030-01-01'
  })
  properties: {
    tenantId: subscription().tenantId
    sku: {
      family: 'A'
      name: 'standard'
    }
    enableRbacAuthorization: true
    enablePurgeProtection: true
  }
}

// CKV_UPW_4 through a module: the tags passed in lack the expiry key.
module identity 'bad_module.bicep' = {
  name: 'identity'
  params: {
    tags: tags
  }
}

// CKV_UPW_8: a Function App without built-in authentication ...
resource openApp 'Microsoft.Web/sites@2025-03-01' = {
  name: 'func-upwell-bad'
  location: location
  tags: union(tags, {
    expiry: '2030-01-01'
  })
  kind: 'functionapp,linux'
  properties: {
    httpsOnly: true
  }
}

// ... and one whose authsettingsV2 lets anonymous callers in and leaves the dashboard open.
resource anonymousApp 'Microsoft.Web/sites@2025-03-01' = {
  name: 'func-upwell-anon'
  location: location
  tags: union(tags, {
    expiry: '2030-01-01'
  })
  kind: 'functionapp,linux'
  properties: {
    httpsOnly: true
  }
}

resource anonymousAuth 'Microsoft.Web/sites/config@2025-03-01' = {
  parent: anonymousApp
  name: 'authsettingsV2'
  properties: {
    platform: {
      enabled: true
    }
    globalValidation: {
      requireAuthentication: false
      unauthenticatedClientAction: 'AllowAnonymous'
      excludedPaths: [
        '/api/dashboard'
      ]
    }
  }
}
