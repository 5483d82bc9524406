// Batch account in user-subscription mode (VMs land in this subscription, so
// they carry our tags and count against our quota, and spot is priced as plain
// spot VMs) and one pool per upwell pool. Every pool starts at 0 nodes with
// autoscale off: upwell's scaler (upwell.pools.batch) resizes them through the
// Batch data plane. Each node's start task runs the agent container, which
// pulls work from the pool's queue until the node is taken away; on a gang pool
// (gangs: true) there is no start task: the scaler adds the agents as Batch
// tasks (multi-instance tasks for shards of several nodes). The pool body
// mirrors upwell.pools.build_batch.pool_body, which the scaler uses if it ever
// has to re-create a pool.

param name string
param location string
param tags object

param keyVaultId string
param keyVaultUri string

@description('Pools to create: [{ id, pool, vmSize, image, mpi, gangs, runOptions }] (id: the Batch pool id; pool: the upwell pool; gangs: agents run as Batch tasks, several-node shards as multi-instance tasks).')
param pools array

@description('Resource id of the worker identity assigned to every pool.')
param workerIdentityId string

@description('Client id of the worker identity (what DefaultAzureCredential on the node uses).')
param workerClientId string

param registryLoginServer string

param storageAccountName string

@description('Subnet for the pools; empty for Batch-managed networking.')
param subnetId string = ''

@secure()
@description('Password of the pools\' user account: a secret of the environment (main.bicep batchUserPassword), never derived from names.')
param userPassword string

@description('Marketplace image for the nodes: the HPC image ships Docker, InfiniBand and NVIDIA drivers.')
param imageReference object = {
  publisher: 'microsoft-dsvm'
  offer: 'ubuntu-hpc'
  sku: '2204'
  version: 'latest'
}
param nodeAgentSkuId string = 'batch.node.ubuntu 22.04'

var registry = {
  registryServer: registryLoginServer
  identityReference: {
    resourceId: workerIdentityId
  }
}

resource account 'Microsoft.Batch/batchAccounts@2025-06-01' = {
  name: name
  location: location
  tags: tags
  properties: {
    poolAllocationMode: 'UserSubscription'
    keyVaultReference: {
      id: keyVaultId
      url: keyVaultUri
    }
    allowedAuthenticationModes: [
      'AAD'
    ]
    publicNetworkAccess: 'Enabled'
  }
}

resource batchPools 'Microsoft.Batch/batchAccounts/pools@2025-06-01' = [for p in pools: {
  parent: account
  name: p.id
  tags: tags
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: {
      '${workerIdentityId}': {}
    }
  }
  properties: {
    displayName: 'upwell ${p.pool}'
    vmSize: p.vmSize
    // Multi-instance tasks need inter-node communication and one task slot per node.
    interNodeCommunication: (p.mpi || p.gangs) ? 'Enabled' : 'Disabled'
    taskSlotsPerNode: 1
    taskSchedulingPolicy: {
      nodeFillType: 'Pack'
    }
    metadata: [
      {
        name: 'upwell-pool'
        value: p.pool
      }
    ]
    // From API 2025-06-01 pools have no targetNodeCommunicationMode (simplified,
    // outbound-only communication is the only mode) and no resourceTags: the
    // pool itself carries the tags above; the VMs, disks and NICs Batch creates
    // for it are not tagged, and they go when the pool scales to zero.
    deploymentConfiguration: {
      virtualMachineConfiguration: {
        imageReference: imageReference
        nodeAgentSkuId: nodeAgentSkuId
        containerConfiguration: {
          type: 'DockerCompatible'
          containerImageNames: [
            p.image
          ]
          containerRegistries: [
            registry
          ]
        }
      }
    }
    networkConfiguration: empty(subnetId) ? null : {
      subnetId: subnetId
      publicIPAddressConfiguration: {
        provision: 'BatchManaged'
      }
    }
    scaleSettings: {
      fixedScale: {
        targetDedicatedNodes: 0
        targetLowPriorityNodes: 0
        resizeTimeout: 'PT15M'
        nodeDeallocationOption: 'TaskCompletion'
      }
    }
    // The image's user for the start task (userIdentity). The API requires a password; no login uses it.
    // It is a secure parameter kept in the azd environment, so that a redeploy sends the same account:
    // a uniqueString of names would be a password anyone who reads this template can compute.
    userAccounts: [
      {
        name: 'upwell'
        password: userPassword
        elevationLevel: 'NonAdmin'
        linuxUserConfiguration: {
          uid: 10001
          gid: 10001
        }
      }
    ]
    // A gang pool's agents are Batch tasks (upwell.pools.build_batch_tasks): no start-task agent, so that
    // Batch alone hands out each node's one task slot.
    startTask: p.gangs ? null : {
      // Batch says whether the node is dedicated; the agent records spot nodes in results.
      commandLine: '/bin/sh -c \'if [ "$AZ_BATCH_NODE_IS_DEDICATED" = true ]; then export UPWELL_NODE_SPOT=0; else export UPWELL_NODE_SPOT=1; fi; exec python -m workers.agent --pool ${p.pool}\''
      containerSettings: {
        imageName: p.image
        containerRunOptions: p.runOptions
        registry: registry
        workingDirectory: 'ContainerImageDefault'
      }
      // The agent's environment (upwell.pools.azure_common.agent_env): identity-based
      // storage through the worker identity; no key.
      environmentSettings: [
        {
          name: 'AZURE_CLIENT_ID'
          value: workerClientId
        }
        {
          name: 'AzureWebJobsStorage__accountName'
          value: storageAccountName
        }
        {
          name: 'AzureWebJobsStorage__clientId'
          value: workerClientId
        }
        {
          name: 'AzureWebJobsStorage__credential'
          value: 'managedidentity'
        }
        {
          // The agent watches Scheduled Events for its own VM (workers.eviction): Batch sends a start
          // task no SIGTERM on a spot eviction or node removal. The same as azure_common.AZURE_VM_ENV.
          name: 'UPWELL_EVICTION_WATCH'
          value: '1'
        }
        {
          name: 'UPWELL_POOL'
          value: p.pool
        }
        {
          name: 'UPWELL_VM_SIZE'
          value: p.vmSize
        }
        {
          // The image's /scratch (owned by its user, below); the same as upwell.pools.build_batch.
          name: 'UPWELL_SCRATCH'
          value: '/scratch'
        }
      ]
      // Batch maps the task user's uid/gid into the container ("Run container applications on Azure
      // Batch"), so the agent runs as the pool's user with the image user's uid/gid (workers/docker:
      // 10001), which owns /scratch; an autoUser's uid is the node's choice and owns nothing there.
      userIdentity: {
        userName: 'upwell'
      }
      maxTaskRetryCount: 3
      // The agent runs for the node's lifetime; the node must not wait for it.
      waitForSuccess: false
    }
  }
}]

output name string = account.name
output id string = account.id
output accountEndpoint string = account.properties.accountEndpoint
