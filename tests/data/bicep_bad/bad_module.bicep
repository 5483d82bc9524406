// Called by bad.bicep with tags that lack `expiry`: CKV_UPW_4 must see through the parameter.
param tags object

resource identity 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: 'id-upwell-bad'
  location: resourceGroup().location
  tags: tags
}
