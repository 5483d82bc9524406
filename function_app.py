"""The Function App: registers the blueprints in handlers/ and nothing else."""

import azure.functions as func

from handlers import api, collect, dashboard, ingest, janitor, notify, reconcile, report, scale

app = func.FunctionApp()
for blueprint in (ingest.bp, collect.bp, scale.bp, report.bp, reconcile.bp, api.bp, janitor.bp, dashboard.bp,
                  notify.bp):
    app.register_functions(blueprint)
