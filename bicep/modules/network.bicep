// The virtual network, deployed only when something needs it: private endpoints
// for storage (privateOnly) or the VM scale set option. Subnets:
//   workers  Batch pools and the scale set; an NSG with no inbound allow rules
//   app      Flex Consumption VNet integration (delegated), privateOnly only
//   pe       private endpoints, privateOnly only
//   aci      container groups created by the scaler (delegated), privateOnly + ACI only
//
// Outbound: default outbound access is retired for new virtual networks (subnets
// are private by default: "Default outbound access in Azure", learn.microsoft.com/
// azure/virtual-network/ip-services/default-outbound-access). Every subnet whose
// machines call out (workers pull images and reach Batch, queues and ARM; the app
// calls ARM and Batch; container groups pull images) is therefore given explicit
// outbound access, a NAT gateway with a static public IP, and says
// defaultOutboundAccess: false so that nothing depends on the retired path. The
// private-endpoint subnet makes no outbound calls and gets none.

param vnetName string
param location string
param tags object

@description('Create the app and private-endpoint subnets.')
param privateOnly bool = false

@description('Create the delegated subnet for container groups.')
param aciSubnet bool = false

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
    natGateway: {
      id: nat.id
    }
    defaultOutboundAccess: false
  }
}
var appSubnet = {
  name: 'snet-app'
  properties: {
    addressPrefix: appPrefix
    networkSecurityGroup: {
      id: workersNsg.id
    }
    natGateway: {
      id: nat.id
    }
    defaultOutboundAccess: false
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
    defaultOutboundAccess: false
  }
}
var aciSubnetDef = {
  name: 'snet-aci'
  properties: {
    addressPrefix: aciPrefix
    networkSecurityGroup: {
      id: workersNsg.id
    }
    natGateway: {
      id: nat.id
    }
    defaultOutboundAccess: false
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

resource natIp 'Microsoft.Network/publicIPAddresses@2025-09-01' = {
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

resource nat 'Microsoft.Network/natGateways@2025-09-01' = {
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
