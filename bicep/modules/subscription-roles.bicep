// What the Function App needs at subscription scope, and nothing else there.
//
// VMSS quota() (upwell/pools/vmss.py) lists the region's compute usages:
// GET /subscriptions/{id}/providers/Microsoft.Compute/locations/{location}/usages
// (Compute REST "Usage - List"; ComputeManagementClient.usage.list), which ARM
// authorises as Microsoft.Compute/locations/usages/read at the subscription.
// No built-in role grants that alone (Reader would grant every read in the
// subscription), so a custom role holds just this action, assignable only here.

targetScope = 'subscription'

@description('Principal id of the Function App identity (the scaler runs there).')
param functionPrincipalId string

@description('The Function App identity name: stable at deployment start, so it keys the assignment name.')
param functionIdentityName string

resource usageReaderRole 'Microsoft.Authorization/roleDefinitions@2022-04-01' = {
  name: guid(subscription().id, 'upwell-compute-usage-reader')
  properties: {
    roleName: 'upwell compute usage reader (${subscription().subscriptionId})'
    description: 'Read the compute vCPU usages and limits of a region (upwell scaler quota).'
    type: 'CustomRole'
    assignableScopes: [
      subscription().id
    ]
    permissions: [
      {
        actions: [
          'Microsoft.Compute/locations/usages/read'
        ]
        notActions: []
      }
    ]
  }
}

resource functionUsageReader 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(subscription().id, functionIdentityName, 'upwell-compute-usage-reader')
  properties: {
    roleDefinitionId: usageReaderRole.id
    principalId: functionPrincipalId
    principalType: 'ServicePrincipal'
  }
}
