// Optional CPU worker pool on a VM scale set of spot VMs (eviction: Delete, so an
// evicted node stops costing money at once). Capacity starts at 0; upwell's
// scaler (upwell.pools.vmss) raises sku.capacity and deletes idle instances, so
// its identity needs rights on this one scale set only. Nodes boot the agent
// container from vmss-cloud-init.yaml. The scaler looks for `<scale_set>-spot`
// (spot) or `<scale_set>` (regular): main.bicep names this resource to match.

param name string
param location string
param tags object

param vmSize string = 'Standard_D4s_v5'

@description('Spot nodes (evicted with 30 s notice, 60-90% cheaper) or Regular.')
@allowed([
  'Spot'
  'Regular'
])
param priority string = 'Spot'

@description('SSH public key for the admin user; password login is disabled.')
param sshPublicKey string

param adminUsername string = 'upwell'
param subnetId string
param workerIdentityId string
param workerClientId string
param registryLoginServer string
param image string
param poolName string = 'cpu'
param storageAccountName string

var spot = priority == 'Spot'
var cloudInit = replace(replace(replace(replace(replace(replace(replace(loadTextContent('vmss-cloud-init.yaml'), '__STORAGE_ACCOUNT__', storageAccountName), '__VM_SIZE__', vmSize), '__CLIENT_ID__', workerClientId), '__POOL__', poolName), '__ACR__', registryLoginServer), '__IMAGE__', image), '__SPOT__', spot ? '1' : '0')

resource scaleSet 'Microsoft.Compute/virtualMachineScaleSets@2024-11-01' = {
  // checkov:skip=CKV_AZURE_95: Nodes are short-lived spot workers built from the latest Ubuntu image at each scale-out; automatic OS upgrades need a health extension and rolling upgrades that would evict running shards.
  // checkov:skip=CKV_AZURE_97: Encryption at host needs the subscription feature Microsoft.Compute/EncryptionAtHost registered first; managed disks are encrypted at rest by the platform and the nodes hold only transient shard data.
  name: name
  location: location
  tags: tags
  sku: {
    name: vmSize
    tier: 'Standard'
    capacity: 0
  }
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: {
      '${workerIdentityId}': {}
    }
  }
  properties: {
    orchestrationMode: 'Uniform'
    overprovision: false
    singlePlacementGroup: false
    upgradePolicy: {
      mode: 'Manual'
    }
    virtualMachineProfile: {
      priority: priority
      evictionPolicy: spot ? 'Delete' : null
      billingProfile: spot ? {
        maxPrice: -1
      } : null
      osProfile: {
        computerNamePrefix: 'upw${poolName}'
        adminUsername: adminUsername
        customData: base64(cloudInit)
        linuxConfiguration: {
          disablePasswordAuthentication: true
          provisionVMAgent: true
          ssh: {
            publicKeys: [
              {
                path: '/home/${adminUsername}/.ssh/authorized_keys'
                keyData: sshPublicKey
              }
            ]
          }
        }
      }
      // Scale-in gives the node 5 minutes' notice through Scheduled Events.
      scheduledEventsProfile: {
        terminateNotificationProfile: {
          enable: true
          notBeforeTimeout: 'PT5M'
        }
      }
      storageProfile: {
        imageReference: {
          publisher: 'Canonical'
          offer: 'ubuntu-24_04-lts'
          sku: 'server'
          version: 'latest'
        }
        osDisk: {
          createOption: 'FromImage'
          caching: 'ReadWrite'
          deleteOption: 'Delete'
          managedDisk: {
            storageAccountType: 'StandardSSD_LRS'
          }
        }
      }
      networkProfile: {
        networkInterfaceConfigurations: [
          {
            name: 'nic'
            properties: {
              primary: true
              ipConfigurations: [
                {
                  name: 'ip'
                  properties: {
                    primary: true
                    subnet: {
                      id: subnetId
                    }
                  }
                }
              ]
            }
          }
        ]
      }
    }
  }
}

output name string = scaleSet.name
output id string = scaleSet.id
