"""HTTP: job status as JSON. Function-key auth on Azure; loopback only locally."""

from __future__ import annotations

import json

import azure.functions as func

from handlers import context
from upwell.results.status import job_status, list_jobs

bp = func.Blueprint()


def _json(body, status: int = 200) -> func.HttpResponse:
    return func.HttpResponse(json.dumps(body, default=str, indent=1), status_code=status,
                             mimetype="application/json")


@bp.function_name("jobs")
@bp.route(route="jobs", methods=["GET"], auth_level=func.AuthLevel.FUNCTION)
def jobs(req: func.HttpRequest) -> func.HttpResponse:
    return _json(list_jobs(context.storage()))


@bp.function_name("job")
@bp.route(route="jobs/{job_id}", methods=["GET"], auth_level=func.AuthLevel.FUNCTION)
def job(req: func.HttpRequest) -> func.HttpResponse:
    status = job_status(context.storage(), req.route_params.get("job_id", ""))
    return _json(status) if status else _json({"error": "no such job"}, 404)
