// Log Analytics + workspace-based Application Insights. Local (key) auth is
// disabled on Application Insights: the Function App sends telemetry with its
// managed identity (APPLICATIONINSIGHTS_AUTHENTICATION_STRING, Authorization=AAD)
// and needs the Monitoring Metrics Publisher role (see rbac.bicep).

param logAnalyticsName string
param applicationInsightsName string
param location string
param tags object

@description('Days of log retention in the workspace.')
@minValue(30)
@maxValue(730)
param retentionInDays int = 30

resource logAnalytics 'Microsoft.OperationalInsights/workspaces@2025-07-01' = {
  name: logAnalyticsName
  location: location
  tags: tags
  properties: {
    sku: {
      name: 'PerGB2018'
    }
    retentionInDays: retentionInDays
    features: {
      disableLocalAuth: true
    }
  }
}

resource applicationInsights 'Microsoft.Insights/components@2020-02-02' = {
  name: applicationInsightsName
  location: location
  tags: tags
  kind: 'web'
  properties: {
    Application_Type: 'web'
    WorkspaceResourceId: logAnalytics.id
    DisableLocalAuth: true
  }
}

output logAnalyticsId string = logAnalytics.id
output applicationInsightsName string = applicationInsights.name
output applicationInsightsId string = applicationInsights.id
// The connection string carries only the instrumentation key (an identifier, not
// a credential) and the ingestion endpoint; with DisableLocalAuth the endpoint
// accepts only Entra ID tokens.
output connectionString string = applicationInsights.properties.ConnectionString
