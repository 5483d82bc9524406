// Container registry for the worker images (upwell-mpi, upwell-gpu). No admin
// user and no anonymous pull: nodes pull with the worker identity (AcrPull).

param name string
param location string
param tags object

@description('Basic and Standard cover a lab; Premium adds private link, geo-replication, retention and content trust.')
@allowed([
  'Basic'
  'Standard'
  'Premium'
])
param sku string = 'Standard'

resource registry 'Microsoft.ContainerRegistry/registries@2025-04-01' = {
  // checkov:skip=CKV_AZURE_139: Private registry access needs the Premium SKU and private endpoints; pulls already require Entra ID (AcrPull, no admin user, no anonymous pull). registrySku=Premium allows it.
  // checkov:skip=CKV_AZURE_166: Image quarantine is a Premium-SKU preview feature; images come only from `az acr build` of this repository and the app accepts only allowlisted repositories (UPWELL_IMAGE_ALLOWLIST).
  name: name
  location: location
  tags: tags
  sku: {
    name: sku
  }
  properties: {
    adminUserEnabled: false
    anonymousPullEnabled: false
    publicNetworkAccess: 'Enabled'
  }
}

output name string = registry.name
output id string = registry.id
output loginServer string = registry.properties.loginServer
