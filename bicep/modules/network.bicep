// The virtual network, deployed only when something needs it: private endpoints
// for storage (privateOnly) or the VM scale set option. Subnets:
//   workers  Batch pools and the scale set; an NSG with no inbound allow rules
//   app      Flex Consumption VNet integration (delegated), privateOnly only
//   pe       private endpoints, privateOnly only
//   aci      container groups created by the scaler (delegated), privateOnly + ACI only

param vnetName string
param location string
param tags object

@description('Create the app and private-endpoint subnets.')
param privateOnly bool = false

@description('Create the delegated subnet for container groups.')
param aciSubnet bool = false

@description('Give the workers subnet a NAT gateway for outbound traffic (scale set nodes have no public IP).')
param natGateway bool = false

param addressPrefix string = '10.42.0.0/16'
param workersPrefix string = '10.42.16.0/20'
param appPrefix string = '10.42.0.0/24'
param pePrefix string = '10.42.1.0/24'
param aciPrefix string = '10.42.2.0/24'

var workersSubnet = {
  name: 'snet-workers'
  properties: {
    addressPrefix: workersPrefix
    networkSecurityGroup: {
      id: workersNsg.id
    }
    natGateway: natGateway ? {
      id: nat.id
    } : null
  }
}
var appSubnet = {
  name: 'snet-app'
  properties: {
    addressPrefix: appPrefix
    networkSecurityGroup: {
      id: workersNsg.id
    }
    delegations: [
      {
        name: 'flex'
        properties: {
          serviceName: 'Microsoft.App/environments'
        }
      }
    ]
  }
}
var peSubnet = {
  name: 'snet-pe'
  properties: {
    addressPrefix: pePrefix
    networkSecurityGroup: {
      id: workersNsg.id
    }
    privateEndpointNetworkPolicies: 'Enabled'
  }
}
var aciSubnetDef = {
  name: 'snet-aci'
  properties: {
    addressPrefix: aciPrefix
    networkSecurityGroup: {
      id: workersNsg.id
    }
    delegations: [
      {
        name: 'aci'
        properties: {
          serviceName: 'Microsoft.ContainerInstance/containerGroups'
        }
      }
    ]
  }
}

resource workersNsg 'Microsoft.Network/networkSecurityGroups@2025-09-01' = {
  name: 'nsg-${vnetName}'
  location: location
  tags: tags
  properties: {
    // No inbound allow rules: workers pull work from queues and Batch uses the
    // simplified (outbound-only) node communication mode.
    securityRules: []
  }
}

resource natIp 'Microsoft.Network/publicIPAddresses@2025-09-01' = if (natGateway) {
  name: 'pip-nat-${vnetName}'
  location: location
  tags: tags
  sku: {
    name: 'Standard'
  }
  properties: {
    publicIPAllocationMethod: 'Static'
  }
}

resource nat 'Microsoft.Network/natGateways@2025-09-01' = if (natGateway) {
  name: 'nat-${vnetName}'
  location: location
  tags: tags
  sku: {
    name: 'Standard'
  }
  properties: {
    idleTimeoutInMinutes: 10
    publicIpAddresses: [
      {
        id: natIp.id
      }
    ]
  }
}

resource vnet 'Microsoft.Network/virtualNetworks@2025-09-01' = {
  name: vnetName
  location: location
  tags: tags
  properties: {
    addressSpace: {
      addressPrefixes: [
        addressPrefix
      ]
    }
    subnets: concat([workersSubnet], privateOnly ? [appSubnet, peSubnet] : [], privateOnly && aciSubnet ? [aciSubnetDef] : [])
  }
}

output vnetId string = vnet.id
output workersSubnetId string = '${vnet.id}/subnets/snet-workers'
output appSubnetId string = privateOnly ? '${vnet.id}/subnets/snet-app' : ''
output peSubnetId string = privateOnly ? '${vnet.id}/subnets/snet-pe' : ''
output aciSubnetId string = privateOnly && aciSubnet ? '${vnet.id}/subnets/snet-aci' : ''
