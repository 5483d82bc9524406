// upwell on Azure: one resource group with storage, the Function App (Flex
// Consumption), Event Grid, a user-subscription Batch account with its pools, a
// container registry, monitoring and a cost budget; optional private endpoints,
// a spot VM scale set and Container Instances. Managed identity end to end: no
// storage key, connection string or SAS is created, stored or output.
//
//   azd up                                   (azure.yaml; parameters in main.parameters.json)
//   az deployment sub create -l <region> -f bicep/main.bicep -p ...   (docs/deploy.md)

targetScope = 'subscription'

// ---------------------------------------------------------------- parameters

@minLength(1)
@maxLength(48)
@description('Environment name (azd). It seeds every resource name, so one subscription can hold several.')
param environmentName string

@minLength(1)
@description('Region for all resources. It must offer Flex Consumption and the chosen VM sizes.')
@metadata({
  azd: {
    type: 'location'
  }
})
param location string

@description('Resource group to create; default rg-upwell-<environmentName>.')
param resourceGroupName string = ''

@description('Tag: the project.')
param project string = 'upwell'

@minLength(1)
@description('Tag: who owns these resources (a person, group or mailbox to ask before deleting).')
param owner string

@description('Tag: the environment (dev, test, prod ...); default the environment name.')
param environmentTag string = ''

@description('Tag: the date after which these resources may be deleted, yyyy-MM-dd. Empty: 30 days after this deployment.')
param expiry string = ''

@description('Deployment time; only the default is meant to be used (it dates the expiry tag).')
param deployedAt string = utcNow()

@description('Object id of a person or group to grant data access for uploads and `upwell status` (azd sets AZURE_PRINCIPAL_ID); empty for none.')
param principalId string = ''

@allowed([
  'User'
  'Group'
  'ServicePrincipal'
])
param principalType string = 'User'

@description('Object id of the operators (a person or group) who register payload definitions with `upwell payload push`: the only write access to the payloads container. Empty for none.')
param operatorPrincipalId string = ''

@allowed([
  'User'
  'Group'
  'ServicePrincipal'
])
param operatorPrincipalType string = 'Group'

@minLength(1)
@description('Object id of the "Microsoft Azure Batch" service principal in this tenant: az ad sp show --id ddbf3205-c6bd-46ae-8127-60eb93363864 --query id -o tsv')
param batchServicePrincipalObjectId string

@description('Grant the Batch service principal its subscription role and Key Vault access here. Turn off if an administrator has done it already.')
param assignBatchServiceRoles bool = true

@description('Close the storage account\'s public endpoint and reach it through private endpoints in a new virtual network.')
param enablePrivateNetwork bool = false

@secure()
@minLength(16)
@description('Password of the Batch pools\' user account (the agent runs as the image\'s user; the API requires a password and nothing logs in with it). bicep/hooks/preprovision.sh makes a random one once per environment and keeps it in the azd environment; a redeploy sends the same one.')
param batchUserPassword string

@description('Recover the environment\'s soft-deleted Key Vault (createMode recover): set by bicep/hooks/preprovision.sh when `azd down` left the vault deleted but not purged (purge protection forbids the purge).')
param keyVaultRecover bool = false

@description('Run the cpu pool on a spot VM scale set instead of Batch.')
param enableVmss bool = false

@description('SSH public key for the scale set\'s admin user (required with enableVmss).')
param vmssSshPublicKey string = ''

param vmssVmSize string = 'Standard_D4s_v5'

@allowed([
  'Spot'
  'Regular'
])
param vmssPriority string = 'Spot'

@description('Run the cpu pool on Azure Container Instances (the scaler creates the groups). Ignored when enableVmss is true.')
param enableAci bool = false

param cpuVmSize string = 'Standard_D4s_v5'
@minValue(0)
param cpuMaxNodes int = 10
@description('Share of cpu nodes asked for as spot, 0.0-1.0.')
param cpuSpotShare string = '0.8'

param mpiVmSize string = 'Standard_D32s_v4'
@minValue(0)
param mpiMaxNodes int = 4
@description('MPI ranks span nodes and one eviction stops them all, so dedicated by default.')
param mpiSpotShare string = '0.0'

@description('GPU node size. NCv3 (V100) sizes are being retired; the A100 size is the default.')
param gpuVmSize string = 'Standard_NC24ads_A100_v4'
@minValue(0)
param gpuMaxNodes int = 4
param gpuSpotShare string = '0.0'

@description('Tag of the worker images in the registry (upwell-mpi, upwell-gpu).')
param imageTag string = 'latest'

@allowed([
  'Basic'
  'Standard'
  'Premium'
])
param registrySku string = 'Standard'

@allowed([
  'Standard_LRS'
  'Standard_ZRS'
  'Standard_GRS'
  'Standard_GZRS'
  'Standard_RAGRS'
  'Standard_RAGZRS'
])
param storageSku string = 'Standard_ZRS'

@minValue(1)
@maxValue(1000)
param functionMaxInstances int = 40

@minValue(0)
@description('Always-ready instances for the blob trigger group; 0 scales from zero (Event Grid deliveries start it).')
param functionBlobAlwaysReady int = 0

@description('Client id of the Entra ID app registration for the Function App\'s built-in authentication (the preprovision hook makes it: UPWELL_AUTH_CLIENT_ID).')
param authClientId string

@description('NCRONTAB schedule of the scale function.')
param scaleSchedule string = '*/30 * * * * *'
@description('NCRONTAB schedule of the reconciler timer (missed, dead-lettered and poisoned events).')
param reconcileSchedule string = '0 */5 * * * *'
@description('How the reconciler finds uploads that no event started: listing (list incoming/ past a last-modified watermark) or changefeed (enable the blob change feed and read only the changes since the last pass).')
@allowed([
  'listing'
  'changefeed'
])
param reconcileSource string = 'listing'

param maxUploadBytes int = 268435456
param maxShards int = 10000
param maxMessageBytes int = 65536
param maxParamBytes int = 16384
@description('Running shards per job; 0 = no cap.')
param maxConcurrency int = 0

@minValue(1)
@description('Monthly budget for the resource group, in the billing currency.')
param budgetAmount int = 500

@description('E-mail addresses for budget alerts (the resource group Owners are always notified).')
param budgetContactEmails array = []

@description('First day of the first budgeted month.')
param budgetStartDate string = utcNow('yyyy-MM-01')

// ---------------------------------------------------------------- names

// The storage names the code reads (upwell/names.py). tests/unit/test_names_consistency.py
// checks these lists against the code; change both together.
var containerNames = [
  'incoming'
  'pipelines'
  'shards'
  'checkpoints'
  'results'
  'reports'
  'quarantine'
  'payloads'
]
var queueNames = [
  'work-cpu'
  'work-mpi'
  'work-gpu'
  'report'
  'work-cpu-poison'
  'work-mpi-poison'
  'work-gpu-poison'
  'report-poison'
  'notify'
  'notify-poison'
]
var tableNames = [
  'jobs'
  'scaling'
  'janitor'
  'jobindex'
  'nodes'
]
// The functions that blob events trigger, the container each one watches, the subject suffix its
// subscription filters on ('' matches every blob) and the webhook Event Grid delivers to: 'blobs',
// a blob trigger with source=EventGrid (the host queues the event, then reads the blob's properties),
// or 'eventgrid', an Event Grid trigger (the function runs inside the delivery: no host queue, no
// message, no blob read before it). collect wants only the shards' result JSON, not the artifacts a
// shard writes beside it, and runs once per result: an Event Grid trigger spares it five storage
// requests each.
var blobTriggers = [
  {
    function: 'ingest'
    container: 'incoming'
    subjectEndsWith: ''
    webhook: 'blobs'
  }
  {
    function: 'collect'
    container: 'results'
    subjectEndsWith: '.json'
    webhook: 'eventgrid'
  }
]
// Infrastructure containers the code never names.
var deploymentContainerName = 'app-package'
var deadLetterContainerName = 'eventgrid-deadletter'

var token = toLower(uniqueString(subscription().id, environmentName, location))
var rgName = empty(resourceGroupName) ? 'rg-upwell-${environmentName}' : resourceGroupName
var storageName = 'stupw${token}'
var functionAppName = 'func-upwell-${token}'
var planName = 'plan-upwell-${token}'
var functionIdentityName = 'id-upwell-func-${token}'
var workerIdentityName = 'id-upwell-worker-${token}'
var logAnalyticsName = 'log-upwell-${token}'
var applicationInsightsName = 'appi-upwell-${token}'
var registryName = 'crupwell${token}'
// Key Vault names are global and outlive a deleted vault (soft delete, purge protection) for its retention:
// one per resource group and environment, and preprovision.sh recovers it after `azd down` (keyVaultRecover).
var keyVaultName = 'kv-upw-${toLower(uniqueString(subscriptionResourceId('Microsoft.Resources/resourceGroups', rgName), environmentName))}'
var batchAccountName = 'baupw${token}'
var systemTopicName = 'evgt-upwell-${token}'
var jobEventsTopicName = 'evgt-upwell-jobs-${token}'
var vnetName = 'vnet-upwell-${token}'
// The scaler names a pool's scale sets <scale_set> (regular) and <scale_set>-spot.
var vmssBaseName = 'vmss-upwell-${token}'
var vmssName = vmssPriority == 'Spot' ? '${vmssBaseName}-spot' : vmssBaseName

var expiryDate = empty(expiry) ? dateTimeAdd(deployedAt, 'P30D', 'yyyy-MM-dd') : expiry
var tags = {
  project: project
  owner: owner
  environment: empty(environmentTag) ? environmentName : environmentTag
  expiry: expiryDate
  'azd-env-name': environmentName
  // What the janitor reads (upwell/cost/tags.py); the same on what the scaler creates.
  'upwell-project': project
  'upwell-owner': owner
  'upwell-expires': expiryDate
}

var cpuBackend = enableVmss ? 'vmss' : (enableAci ? 'aci' : 'batch')
var needsNetwork = enablePrivateNetwork || enableVmss
var vnetId = '${rg.id}/providers/Microsoft.Network/virtualNetworks/${vnetName}'

// Azure Batch Service Orchestration Role: lets the Batch service create the
// pools' VMs, disks and NICs in this subscription (user-subscription mode).
var batchServiceOrchestrationRole = 'a35466a1-cfd6-450a-b35e-683fcdf30363'

// ---------------------------------------------------------------- resources

resource rg 'Microsoft.Resources/resourceGroups@2025-04-01' = {
  name: rgName
  location: location
  tags: tags
}

resource batchOrchestration 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (assignBatchServiceRoles) {
  name: guid(subscription().id, batchServicePrincipalObjectId, batchServiceOrchestrationRole)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', batchServiceOrchestrationRole)
    principalId: batchServicePrincipalObjectId
    principalType: 'ServicePrincipal'
  }
}

module identity 'modules/identity.bicep' = {
  name: 'identity'
  scope: rg
  params: {
    functionIdentityName: functionIdentityName
    workerIdentityName: workerIdentityName
    location: location
    tags: tags
  }
}

module monitoring 'modules/monitoring.bicep' = {
  name: 'monitoring'
  scope: rg
  params: {
    logAnalyticsName: logAnalyticsName
    applicationInsightsName: applicationInsightsName
    location: location
    tags: tags
  }
}

module storage 'modules/storage.bicep' = {
  name: 'storage'
  scope: rg
  params: {
    name: storageName
    location: location
    tags: tags
    skuName: storageSku
    containerNames: containerNames
    infraContainerNames: [
      deploymentContainerName
      deadLetterContainerName
    ]
    queueNames: queueNames
    tableNames: tableNames
    privateOnly: enablePrivateNetwork
    changeFeedEnabled: reconcileSource == 'changefeed'
    logAnalyticsId: monitoring.outputs.logAnalyticsId
  }
}

module network 'modules/network.bicep' = if (needsNetwork) {
  name: 'network'
  scope: rg
  params: {
    vnetName: vnetName
    location: location
    tags: tags
    privateOnly: enablePrivateNetwork
    aciSubnet: cpuBackend == 'aci'
  }
}

module privateLink 'modules/privatelink.bicep' = if (enablePrivateNetwork) {
  name: 'privatelink'
  scope: rg
  params: {
    storageAccountName: storage.outputs.name
    vnetId: vnetId
    subnetId: '${vnetId}/subnets/snet-pe'
    location: location
    tags: tags
  }
  dependsOn: [
    network
  ]
}

module registry 'modules/registry.bicep' = {
  name: 'registry'
  scope: rg
  params: {
    name: registryName
    location: location
    tags: tags
    sku: registrySku
  }
}

module keyVault 'modules/keyvault.bicep' = {
  name: 'keyvault'
  scope: rg
  params: {
    name: keyVaultName
    location: location
    tags: tags
    recover: keyVaultRecover
    batchServicePrincipalObjectId: assignBatchServiceRoles ? batchServicePrincipalObjectId : ''
    functionPrincipalId: identity.outputs.functionPrincipalId
  }
}

var mpiImage = '${registry.outputs.loginServer}/upwell-mpi:${imageTag}'
var gpuImage = '${registry.outputs.loginServer}/upwell-gpu:${imageTag}'

// docker options of the agent container per pool: host networking (MPI, IMDS).
// No --gpus: on GPU hardware Batch enables the GPUs for container tasks itself
// ("Run container applications on Azure Batch"). The images' entrypoint (workers/docker/entrypoint.sh)
// runs a full command line as written, so the start task's command is not
// appended to the agent (the same holds for upwell.pools.build_batch's pools).
var cpuRunOptions = '--rm --network host'
var mpiRunOptions = '--rm --network host --ipc host'
var gpuRunOptions = '--rm --network host --ipc host'

var cpuBatchPool = {
  id: 'upwell-cpu'
  pool: 'cpu'
  vmSize: cpuVmSize
  image: mpiImage
  mpi: false
  gangs: false
  runOptions: cpuRunOptions
}
var mpiBatchPool = {
  id: 'upwell-mpi'
  pool: 'mpi'
  vmSize: mpiVmSize
  image: mpiImage
  mpi: true
  // Gangs: shards of several nodes run as Batch multi-instance tasks (upwell.pools.build_batch_tasks), so
  // every agent on this pool is a Batch task and its nodes have no start-task agent.
  gangs: true
  runOptions: mpiRunOptions
}
var gpuBatchPool = {
  id: 'upwell-gpu'
  pool: 'gpu'
  vmSize: gpuVmSize
  image: gpuImage
  mpi: false
  gangs: false
  runOptions: gpuRunOptions
}

module batch 'modules/batch.bicep' = {
  name: 'batch'
  scope: rg
  params: {
    name: batchAccountName
    location: location
    tags: tags
    keyVaultId: keyVault.outputs.id
    keyVaultUri: keyVault.outputs.uri
    pools: concat(cpuBackend == 'batch' ? [
      cpuBatchPool
    ] : [], [
      mpiBatchPool
      gpuBatchPool
    ])
    workerIdentityId: identity.outputs.workerIdentityId
    workerClientId: identity.outputs.workerClientId
    registryLoginServer: registry.outputs.loginServer
    storageAccountName: storage.outputs.name
    subnetId: enablePrivateNetwork ? '${vnetId}/subnets/snet-workers' : ''
    userPassword: batchUserPassword
  }
  dependsOn: [
    batchOrchestration
    network
  ]
}

module vmss 'modules/vmss.bicep' = if (enableVmss) {
  name: 'vmss'
  scope: rg
  params: {
    name: vmssName
    location: location
    tags: tags
    vmSize: vmssVmSize
    priority: vmssPriority
    sshPublicKey: vmssSshPublicKey
    subnetId: '${vnetId}/subnets/snet-workers'
    workerIdentityId: identity.outputs.workerIdentityId
    workerClientId: identity.outputs.workerClientId
    registryLoginServer: registry.outputs.loginServer
    image: mpiImage
    poolName: 'cpu'
    storageAccountName: storage.outputs.name
  }
  dependsOn: [
    network
  ]
}

// UPWELL_POOLS: one entry per pool in upwell/names.py POOLS. The keys are
// upwell.pools.base.PoolSpec fields; `options` is what each backend reads
// (upwell/pools/build_batch.py, build_vmss.py, azure_common.py). The worker
// identity, registry and storage account let the scaler re-create a pool that
// was deleted; `tags` go on anything it creates, so the expiry tag finds it.
var batchAccountUrl = 'https://${batch.outputs.accountEndpoint}'
var workerOptions = {
  subscription_id: subscription().subscriptionId
  resource_group: rgName
  location: location
  registry: registry.outputs.loginServer
  identity_id: identity.outputs.workerIdentityId
  identity_client_id: identity.outputs.workerClientId
  storage_account: storage.outputs.name
  tags: {
    project: project
    owner: owner
    environment: tags.environment
    expiry: expiryDate
    'upwell-project': project
    'upwell-owner': owner
  }
}
var batchOptions = union(workerOptions, {
  account_url: batchAccountUrl
  account_name: batch.outputs.name
  subnet_id: enablePrivateNetwork ? '${vnetId}/subnets/snet-workers' : ''
})
var cpuPoolBatch = {
  backend: 'batch'
  vm_size: cpuVmSize
  max_nodes: cpuMaxNodes
  spot_share: json(cpuSpotShare)
  price_key: cpuVmSize
  options: union(batchOptions, {
    pool_id: cpuBatchPool.id
    image: mpiImage
    container_run_options: cpuRunOptions
  })
}
var cpuPoolVmss = {
  backend: 'vmss'
  vm_size: vmssVmSize
  max_nodes: cpuMaxNodes
  spot_share: vmssPriority == 'Spot' ? json('1.0') : json('0.0')
  price_key: vmssVmSize
  options: union(workerOptions, {
    scale_set: vmssBaseName
    image: mpiImage
    subnet_id: '${vnetId}/subnets/snet-workers'
    ssh_public_key: vmssSshPublicKey
  })
}
var cpuPoolAci = {
  backend: 'aci'
  vm_size: 'aci-4vcpu-16gb'
  max_nodes: cpuMaxNodes
  spot_share: json('0.0')
  price_key: 'aci-4vcpu-16gb'
  options: union(workerOptions, {
    image: mpiImage
    cpu: 4
    memory_gb: 16
    subnet_id: enablePrivateNetwork ? '${vnetId}/subnets/snet-aci' : ''
  })
}
var mpiPool = {
  backend: 'batch'
  vm_size: mpiVmSize
  max_nodes: mpiMaxNodes
  spot_share: json(mpiSpotShare)
  price_key: mpiVmSize
  options: union(batchOptions, {
    pool_id: mpiBatchPool.id
    image: mpiImage
    mpi: true
    gangs: mpiBatchPool.gangs
    container_run_options: mpiRunOptions
  })
}
var gpuPool = {
  backend: 'batch'
  vm_size: gpuVmSize
  max_nodes: gpuMaxNodes
  spot_share: json(gpuSpotShare)
  price_key: gpuVmSize
  options: union(batchOptions, {
    pool_id: gpuBatchPool.id
    image: gpuImage
    gpu: true
    container_run_options: gpuRunOptions
  })
}
var upwellPools = {
  cpu: cpuBackend == 'batch' ? cpuPoolBatch : (cpuBackend == 'vmss' ? cpuPoolVmss : cpuPoolAci)
  mpi: mpiPool
  gpu: gpuPool
}

// The Function App's whole app-settings set. Storage is identity based
// (AzureWebJobsStorage__*ServiceUri + __credential + __clientId); there is no
// AzureWebJobsStorage connection string. Telemetry authenticates with Entra ID.
var functionAppSettings = {
  AzureWebJobsStorage__blobServiceUri: storage.outputs.blobEndpoint
  AzureWebJobsStorage__queueServiceUri: storage.outputs.queueEndpoint
  AzureWebJobsStorage__tableServiceUri: storage.outputs.tableEndpoint
  AzureWebJobsStorage__credential: 'managedidentity'
  AzureWebJobsStorage__clientId: identity.outputs.functionClientId
  AZURE_CLIENT_ID: identity.outputs.functionClientId
  APPLICATIONINSIGHTS_CONNECTION_STRING: monitoring.outputs.connectionString
  APPLICATIONINSIGHTS_AUTHENTICATION_STRING: 'Authorization=AAD;ClientId=${identity.outputs.functionClientId}'
  UPWELL_POOLS: string(upwellPools)
  UPWELL_SCALE_SCHEDULE: scaleSchedule
  // Ingest runs a scale pass as soon as it accepted a job (the scale timer runs in this app): nodes start at
  // the arrival, not at the next tick. `upwell simulate` models the upwell policy with it on.
  UPWELL_SCALE_ON_INGEST: 'true'
  UPWELL_RECONCILE_SCHEDULE: reconcileSchedule
  UPWELL_RECONCILE_SOURCE: reconcileSource
  UPWELL_MAX_UPLOAD_BYTES: string(maxUploadBytes)
  UPWELL_MAX_SHARDS: string(maxShards)
  UPWELL_MAX_MESSAGE_BYTES: string(maxMessageBytes)
  UPWELL_MAX_PARAM_BYTES: string(maxParamBytes)
  UPWELL_MAX_CONCURRENCY: string(maxConcurrency)
  // Exact image names a manifest may ask for: the short names and the full references.
  UPWELL_IMAGE_ALLOWLIST: 'upwell-mpi,upwell-gpu,${mpiImage},${gpuImage}'
  // Registries a pushed payload definition's image may come from: this deployment's own.
  UPWELL_REGISTRY_ALLOWLIST: registry.outputs.loginServer
  UPWELL_BATCH_ACCOUNT_URL: batchAccountUrl
  UPWELL_SUBSCRIPTION_ID: subscription().subscriptionId
  UPWELL_RESOURCE_GROUP: rgName
  UPWELL_WORKER_IDENTITY_ID: identity.outputs.workerIdentityId
  UPWELL_WORKER_IMAGE_CPU: mpiImage
  UPWELL_WORKER_IMAGE_GPU: gpuImage
  // A job's project is the folder it is uploaded to (incoming/<project>/), as the uploaders' ABAC role
  // conditions are (`upwell access grant`, docs/access.md); a manifest naming another project is refused.
  UPWELL_PROJECT_FOLDERS: 'true'
  // Job events (upwell.after.notify) go to the custom topic; webhook secrets are read from the vault by name.
  UPWELL_EVENTGRID_ENDPOINT: jobEvents.outputs.endpoint
  UPWELL_KEY_VAULT_URL: keyVault.outputs.uri
}

module jobEvents 'modules/jobtopic.bicep' = {
  name: 'jobtopic'
  scope: rg
  params: {
    name: jobEventsTopicName
    location: location
    tags: tags
    functionPrincipalId: identity.outputs.functionPrincipalId
  }
}

module functionApp 'modules/functionapp.bicep' = {
  name: 'functionapp'
  scope: rg
  params: {
    planName: planName
    appName: functionAppName
    location: location
    tags: tags
    identityId: identity.outputs.functionIdentityId
    identityClientId: identity.outputs.functionClientId
    blobEndpoint: storage.outputs.blobEndpoint
    deploymentContainerName: deploymentContainerName
    appSettings: functionAppSettings
    subnetId: enablePrivateNetwork ? '${vnetId}/subnets/snet-app' : ''
    maximumInstanceCount: functionMaxInstances
    blobAlwaysReady: functionBlobAlwaysReady
    authClientId: authClientId
  }
  dependsOn: [
    network
  ]
}

module rbac 'modules/rbac.bicep' = {
  name: 'rbac'
  scope: rg
  params: {
    storageAccountName: storage.outputs.name
    registryName: registry.outputs.name
    batchAccountName: batch.outputs.name
    applicationInsightsName: monitoring.outputs.applicationInsightsName
    workerIdentityName: identity.outputs.workerIdentityName
    functionPrincipalId: identity.outputs.functionPrincipalId
    workerPrincipalId: identity.outputs.workerPrincipalId
    enableVmss: enableVmss
    vmssName: vmssName
    vnetName: vnetName
    enableAci: cpuBackend == 'aci'
    deployerPrincipalId: principalId
    deployerPrincipalType: principalType
    operatorPrincipalId: operatorPrincipalId
    operatorPrincipalType: operatorPrincipalType
  }
  dependsOn: [
    vmss
  ]
}

// The scaler's quota read (compute usages) is a subscription-scope action.
module subscriptionRoles 'modules/subscription-roles.bicep' = if (enableVmss) {
  name: 'subscription-roles'
  params: {
    functionPrincipalId: identity.outputs.functionPrincipalId
    functionIdentityName: functionIdentityName
  }
}

module eventTopic 'modules/eventtopic.bicep' = {
  name: 'eventtopic'
  scope: rg
  params: {
    name: systemTopicName
    location: location
    tags: tags
    storageAccountName: storage.outputs.name
    deadLetterContainerName: deadLetterContainerName
  }
}

// The Event Grid subscriptions (modules/events.bicep) are deliberately not part
// of this template: their webhook needs the Functions blobs_extension system key,
// which exists only after the code is deployed and the host has started. Only
// bicep/hooks/postdeploy.sh deploys them, after it has seen the functions listed
// and the key present. A later provision (incremental mode) leaves them in place;
// a provision into an empty resource group never tries to create them early.

module budget 'modules/budget.bicep' = {
  name: 'budget'
  scope: rg
  params: {
    name: 'budget-upwell-${environmentName}'
    amount: budgetAmount
    contactEmails: budgetContactEmails
    startDate: budgetStartDate
  }
}

// ---------------------------------------------------------------- outputs (azd writes them to .azure/<env>/.env)

output AZURE_LOCATION string = location
output AZURE_TENANT_ID string = tenant().tenantId
output AZURE_SUBSCRIPTION_ID string = subscription().subscriptionId
output AZURE_RESOURCE_GROUP string = rg.name
output AZURE_STORAGE_ACCOUNT string = storage.outputs.name
output AZURE_STORAGE_BLOB_ENDPOINT string = storage.outputs.blobEndpoint
output AZURE_STORAGE_QUEUE_ENDPOINT string = storage.outputs.queueEndpoint
output AZURE_STORAGE_TABLE_ENDPOINT string = storage.outputs.tableEndpoint
output AZURE_FUNCTION_APP_NAME string = functionApp.outputs.name
output AZURE_FUNCTION_APP_HOST string = functionApp.outputs.hostName
output AZURE_FUNCTION_IDENTITY_CLIENT_ID string = identity.outputs.functionClientId
output AZURE_WORKER_IDENTITY_ID string = identity.outputs.workerIdentityId
output AZURE_WORKER_IDENTITY_CLIENT_ID string = identity.outputs.workerClientId
output AZURE_BATCH_ACCOUNT_NAME string = batch.outputs.name
output AZURE_BATCH_ACCOUNT_URL string = batchAccountUrl
output AZURE_CONTAINER_REGISTRY_NAME string = registry.outputs.name
output AZURE_CONTAINER_REGISTRY_ENDPOINT string = registry.outputs.loginServer
output AZURE_KEY_VAULT_NAME string = keyVault.outputs.name
output AZURE_VMSS_NAME string = enableVmss ? vmssName : ''
output EVENTGRID_SYSTEM_TOPIC_NAME string = eventTopic.outputs.name
output EVENTGRID_DEADLETTER_CONTAINER string = deadLetterContainerName
output UPWELL_BLOB_TRIGGERS array = blobTriggers
output UPWELL_EXPIRY string = expiryDate
