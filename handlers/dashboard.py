"""HTTP: the live dashboard (page, JSON API, report files). Function-key auth on Azure; loopback only locally."""

from __future__ import annotations

import json

import azure.functions as func

from handlers import context
from upwell.ops import dashboard

bp = func.Blueprint()
NO_STORE = {"Cache-Control": "no-store"}
# Everything is inline or same-origin: no CDN, nothing fetched from elsewhere.
CSP = ("default-src 'self'; img-src 'self' data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'; "
       "connect-src 'self'")


def _json(body, status: int = 200) -> func.HttpResponse:
    return func.HttpResponse(json.dumps(body, default=str), status_code=status, mimetype="application/json",
                             headers=NO_STORE)


@bp.function_name("dashboard")
@bp.route(route="dashboard", methods=["GET"], auth_level=func.AuthLevel.FUNCTION)
def page(req: func.HttpRequest) -> func.HttpResponse:
    return func.HttpResponse(dashboard.page(), mimetype="text/html", charset="utf-8",
                             headers={**NO_STORE, "Content-Security-Policy": CSP})


@bp.function_name("dashboard_state")
@bp.route(route="dashboard/api/state", methods=["GET"], auth_level=func.AuthLevel.FUNCTION)
def state(req: func.HttpRequest) -> func.HttpResponse:
    return _json(dashboard.snapshot(context.storage(), context.settings()))


@bp.function_name("dashboard_job")
@bp.route(route="dashboard/api/jobs/{job_id}", methods=["GET"], auth_level=func.AuthLevel.FUNCTION)
def job(req: func.HttpRequest) -> func.HttpResponse:
    detail = dashboard.job_detail(context.storage(), req.route_params.get("job_id", ""),
                                  req.params.get("after", ""))
    return _json(detail) if detail else _json({"error": "no such job"}, 404)


@bp.function_name("dashboard_report")
@bp.route(route="dashboard/reports/{job_id}/{*path}", methods=["GET"], auth_level=func.AuthLevel.FUNCTION)
def report(req: func.HttpRequest) -> func.HttpResponse:
    found = dashboard.report_file(context.storage(), req.route_params.get("job_id", ""),
                                  req.route_params.get("path", "") or "index.html")
    if found is None:
        return func.HttpResponse("no such report file", status_code=404)
    data, mimetype = found
    return func.HttpResponse(data, mimetype=mimetype.split(";")[0], headers=NO_STORE)
