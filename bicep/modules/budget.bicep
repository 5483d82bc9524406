// A monthly cost budget on the resource group with e-mail alerts at 50, 80 and
// 100% of actual spend and at 100% of forecast spend. It alerts; it does not stop
// anything: upwell's own per-job budgets stop dispatch (DESIGN.md "Cost").

param name string

@description('Monthly budget in the billing currency.')
@minValue(1)
param amount int

@description('Who gets the alerts; the resource group Owners are always notified too.')
param contactEmails array = []

@description('First day of the first budgeted month, yyyy-MM-dd.')
param startDate string

var notifications = {
  actual50: {
    enabled: true
    operator: 'GreaterThanOrEqualTo'
    threshold: 50
    thresholdType: 'Actual'
    contactEmails: contactEmails
    contactRoles: [
      'Owner'
    ]
  }
  actual80: {
    enabled: true
    operator: 'GreaterThanOrEqualTo'
    threshold: 80
    thresholdType: 'Actual'
    contactEmails: contactEmails
    contactRoles: [
      'Owner'
    ]
  }
  actual100: {
    enabled: true
    operator: 'GreaterThanOrEqualTo'
    threshold: 100
    thresholdType: 'Actual'
    contactEmails: contactEmails
    contactRoles: [
      'Owner'
    ]
  }
  forecast100: {
    enabled: true
    operator: 'GreaterThanOrEqualTo'
    threshold: 100
    thresholdType: 'Forecasted'
    contactEmails: contactEmails
    contactRoles: [
      'Owner'
    ]
  }
}

resource budget 'Microsoft.Consumption/budgets@2024-08-01' = {
  name: name
  properties: {
    category: 'Cost'
    amount: amount
    timeGrain: 'Monthly'
    timePeriod: {
      startDate: startDate
    }
    notifications: notifications
  }
}

output name string = budget.name
