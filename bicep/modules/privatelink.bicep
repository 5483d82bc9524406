// Private endpoints for the blob, queue and table services of the storage
// account, with their privatelink DNS zones linked to the virtual network.

param storageAccountName string
param vnetId string
param subnetId string
param location string
param tags object

var services = [
  'blob'
  'queue'
  'table'
]

resource storage 'Microsoft.Storage/storageAccounts@2025-08-01' existing = {
  name: storageAccountName
}

resource zones 'Microsoft.Network/privateDnsZones@2024-06-01' = [for s in services: {
  name: 'privatelink.${s}.${environment().suffixes.storage}'
  location: 'global'
  tags: tags
}]

resource links 'Microsoft.Network/privateDnsZones/virtualNetworkLinks@2024-06-01' = [for (s, i) in services: {
  parent: zones[i]
  name: 'link-${s}'
  location: 'global'
  tags: tags
  properties: {
    registrationEnabled: false
    virtualNetwork: {
      id: vnetId
    }
  }
}]

resource endpoints 'Microsoft.Network/privateEndpoints@2025-09-01' = [for s in services: {
  name: 'pe-${storageAccountName}-${s}'
  location: location
  tags: tags
  properties: {
    subnet: {
      id: subnetId
    }
    privateLinkServiceConnections: [
      {
        name: 'pe-${s}'
        properties: {
          privateLinkServiceId: storage.id
          groupIds: [
            s
          ]
        }
      }
    ]
  }
}]

resource zoneGroups 'Microsoft.Network/privateEndpoints/privateDnsZoneGroups@2025-09-01' = [for (s, i) in services: {
  parent: endpoints[i]
  name: 'default'
  properties: {
    privateDnsZoneConfigs: [
      {
        name: s
        properties: {
          privateDnsZoneId: zones[i].id
        }
      }
    ]
  }
}]
