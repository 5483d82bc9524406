// The Function App on the Flex Consumption plan (Linux, Python 3.11). It runs as
// a user-assigned identity: the deployment package, AzureWebJobsStorage and
// telemetry all authenticate with it; no storage key or connection string is
// set. Basic-auth publishing (FTP and SCM) is switched off.

param planName string
param appName string
param location string
param tags object

param identityId string
param identityClientId string

@description('Blob endpoint of the storage account that holds the deployment package.')
param blobEndpoint string
param deploymentContainerName string

@description('App settings (name -> value), merged over nothing: this is the whole set.')
param appSettings object

@description('Subnet for VNet integration; empty for none.')
param subnetId string = ''

@minValue(40)
@maxValue(1000)
param maximumInstanceCount int = 40

@allowed([
  512
  2048
  4096
])
param instanceMemoryMB int = 2048

// Flex Consumption scales every function group from zero, the `blob` group
// (Event Grid-sourced blob triggers) included: an Event Grid delivery to the
// blobs extension webhook starts an instance, and a delivery that times out
// during a cold start is retried by Event Grid. Always-ready instances are
// optional (default 0) and only cut that cold-start latency, at a cost for every
// hour they exist. See docs/deploy.md, "Cold starts and always-ready instances".
@minValue(0)
@description('Always-ready instances for the blob trigger group (ingest, collect); 0 = scale from zero.')
param blobAlwaysReady int = 0

@description('Client id of the Entra ID app registration that signs people in to the dashboard and the API (built-in authentication, authsettingsV2).')
@minLength(36)
param authClientId string

@description('Entra ID tenant that issues the sign-in tokens.')
param authTenantId string = subscription().tenantId

resource plan 'Microsoft.Web/serverfarms@2025-03-01' = {
  // checkov:skip=CKV_AZURE_225: Flex Consumption zone redundancy exists only in some regions and would make the template fail elsewhere; the functions keep no state (it is in ZRS storage) and Event Grid retries for 24 h.
  name: planName
  location: location
  tags: tags
  kind: 'functionapp'
  sku: {
    name: 'FC1'
    tier: 'FlexConsumption'
  }
  properties: {
    reserved: true
  }
}

resource site 'Microsoft.Web/sites@2025-03-01' = {
  // checkov:skip=CKV_AZURE_222: Event Grid delivers blob events to the blobs extension webhook over the internet, so the app needs a public endpoint; the webhook is authenticated by the Functions system key.
  // checkov:skip=CKV_AZURE_17: Event Grid webhook delivery cannot present a client certificate.
  // checkov:skip=CKV_AZURE_212: Flex Consumption scales from zero by design and Event Grid deliveries start the blob group; always-ready instances are optional (blobAlwaysReady) and cost money around the clock.
  // checkov:skip=CKV_AZURE_213: The App Service health check does not apply to Flex Consumption (no fixed instance set to rotate); the host's health is in Application Insights.
  name: appName
  location: location
  // azd finds the service to deploy by this tag.
  tags: union(tags, {
    'azd-service-name': 'api'
  })
  kind: 'functionapp,linux'
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: {
      '${identityId}': {}
    }
  }
  properties: {
    serverFarmId: plan.id
    httpsOnly: true
    clientCertEnabled: false
    // Event Grid delivers blob events to the blobs extension webhook, so the app
    // keeps a public endpoint; the webhook is authenticated by the system key.
    publicNetworkAccess: 'Enabled'
    virtualNetworkSubnetId: empty(subnetId) ? null : subnetId
    siteConfig: {
      minTlsVersion: '1.2'
      scmMinTlsVersion: '1.2'
      ftpsState: 'Disabled'
      http20Enabled: true
      remoteDebuggingEnabled: false
      appSettings: [for setting in items(appSettings): {
        name: setting.key
        value: setting.value
      }]
    }
    functionAppConfig: {
      deployment: {
        storage: {
          type: 'blobContainer'
          value: '${blobEndpoint}${deploymentContainerName}'
          authentication: {
            type: 'UserAssignedIdentity'
            userAssignedIdentityResourceId: identityId
          }
        }
      }
      scaleAndConcurrency: {
        maximumInstanceCount: maximumInstanceCount
        instanceMemoryMB: instanceMemoryMB
        alwaysReady: blobAlwaysReady > 0 ? [
          {
            name: 'blob'
            instanceCount: blobAlwaysReady
          }
        ] : []
      }
      runtime: {
        name: 'python'
        version: '3.11'
      }
    }
  }
}

// Built-in authentication (Easy Auth): every request needs an Entra ID sign-in; a browser without one is
// sent to the sign-in page and an API client gets 401 (Easy Auth answers 401 to requests that cannot follow a
// redirect). The signed-in principal reaches the functions in X-MS-CLIENT-PRINCIPAL. Only the blobs
// extension's webhook is left out: Event Grid delivers blob events there and cannot sign in; the system key
// authenticates it. Function keys stay for automation, which signs in as an app (client credentials) too.
resource auth 'Microsoft.Web/sites/config@2025-03-01' = {
  // checkov:skip=CKV_AZURE_13: checkov reads the legacy authsettings shape (properties.enabled); authsettingsV2 keeps it in platform.enabled, which CKV_UPW_8 checks with requireAuthentication, the Entra ID provider and no anonymous access.
  // checkov:skip=CKV_AZURE_222: checkov applies its site checks to every sites/config; public network access is the site's (skipped there: Event Grid's webhook needs it).
  // checkov:skip=CKV_AZURE_63: a site-configuration check that checkov applies to every sites/config; authsettingsV2 has no HTTP logging setting (the host logs to Application Insights).
  // checkov:skip=CKV_AZURE_65: as CKV_AZURE_63: detailed error messages are a site-configuration setting, not one of authsettingsV2.
  // checkov:skip=CKV_AZURE_66: as CKV_AZURE_63: failed request tracing is a site-configuration setting, not one of authsettingsV2.
  // checkov:skip=CKV_AZURE_80: as CKV_AZURE_63: the .NET Framework version is a site-configuration setting; the app runs Python.
  // checkov:skip=CKV_AZURE_88: as CKV_AZURE_63: Azure Files mounts are a site-configuration setting; the app keeps no files (its state is in storage).
  parent: site
  name: 'authsettingsV2'
  properties: {
    platform: {
      enabled: true
    }
    globalValidation: {
      requireAuthentication: true
      unauthenticatedClientAction: 'RedirectToLoginPage'
      redirectToProvider: 'azureactivedirectory'
      excludedPaths: [
        '/runtime/webhooks/blobs'
        '/runtime/webhooks/eventgrid'
      ]
    }
    identityProviders: {
      azureActiveDirectory: {
        enabled: true
        registration: {
          clientId: authClientId
          openIdIssuer: '${environment().authentication.loginEndpoint}${authTenantId}/v2.0'
        }
        validation: {
          allowedAudiences: [
            'api://${authClientId}'
            authClientId
          ]
        }
      }
    }
  }
}

resource ftpPolicy 'Microsoft.Web/sites/basicPublishingCredentialsPolicies@2025-03-01' = {
  parent: site
  name: 'ftp'
  properties: {
    allow: false
  }
}

resource scmPolicy 'Microsoft.Web/sites/basicPublishingCredentialsPolicies@2025-03-01' = {
  parent: site
  name: 'scm'
  properties: {
    allow: false
  }
}

output name string = site.name
output id string = site.id
output hostName string = site.properties.defaultHostName
output clientId string = identityClientId
