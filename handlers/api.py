"""HTTP: jobs as JSON, and the actions on one job (cancel, rerun) and its shards' logs.

Each call answers only within the caller's projects (``upwell.access.principal``): a signed-in principal
(Entra ID through the Function App's built-in authentication, ``X-MS-CLIENT-PRINCIPAL``) sees its projects;
a call on a function key is automation and sees every project. Function-key auth on Azure; loopback
only locally. The dashboard's buttons call these same routes with the same key.
"""

from __future__ import annotations

import azure.functions as func

from handlers import context

bp = func.Blueprint()


@bp.function_name("jobs")
@bp.route(route="jobs", methods=["GET"], auth_level=func.AuthLevel.FUNCTION)
def jobs(req: func.HttpRequest) -> func.HttpResponse:
    """?owner=, ?project=, ?state= filter the list."""
    return context.http_json(lambda: context.job_api(req).jobs(
        owner=req.params.get("owner", ""), project=req.params.get("project", ""), state=req.params.get("state", "")))


@bp.function_name("job")
@bp.route(route="jobs/{job_id}", methods=["GET"], auth_level=func.AuthLevel.FUNCTION)
def job(req: func.HttpRequest) -> func.HttpResponse:
    return context.http_json(lambda: context.job_api(req).status(req.route_params.get("job_id", "")))


@bp.function_name("job_cancel")
@bp.route(route="jobs/{job_id}/cancel", methods=["POST"], auth_level=func.AuthLevel.FUNCTION)
def cancel(req: func.HttpRequest) -> func.HttpResponse:
    return context.http_json(lambda: context.job_api(req).cancel(req.route_params.get("job_id", "")))


@bp.function_name("job_rerun")
@bp.route(route="jobs/{job_id}/rerun", methods=["POST"], auth_level=func.AuthLevel.FUNCTION)
def rerun(req: func.HttpRequest) -> func.HttpResponse:
    """?failed=true re-runs only the failed shards; else every shard that did not succeed."""
    failed = req.params.get("failed", "").lower() in ("1", "true", "yes")
    return context.http_json(lambda: context.job_api(req).rerun(req.route_params.get("job_id", ""), failed=failed))


@bp.function_name("shard_log")
@bp.route(route="jobs/{job_id}/shards/{shard_id}/log", methods=["GET"], auth_level=func.AuthLevel.FUNCTION)
def shard_log(req: func.HttpRequest) -> func.HttpResponse:
    """The shard's last payload.log as text (404 until an attempt has ended and its log is kept)."""
    return context.http_json(
        lambda: context.job_api(req).shard_log(req.route_params.get("job_id", ""),
                                               req.route_params.get("shard_id", "")),
        missing="no log for this shard (yet)",
        render=lambda data: func.HttpResponse(data, mimetype="text/plain", charset="utf-8",
                                              headers={"Cache-Control": "no-store"}))
