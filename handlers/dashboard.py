"""HTTP: the live dashboard (page, JSON API, report files). Function-key auth on Azure; loopback only locally.

What it shows and serves is held to the caller's projects (``upwell.access.principal``), as the API is;
its cancel and rerun buttons call the API's routes (``handlers.api``) with the same key.
"""

from __future__ import annotations

import azure.functions as func

from handlers import context
from upwell.ops import dashboard

bp = func.Blueprint()
NO_STORE = {"Cache-Control": "no-store"}
# Everything is inline or same-origin: no CDN, nothing fetched from elsewhere.
CSP = ("default-src 'self'; img-src 'self' data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'; "
       "connect-src 'self'")


@bp.function_name("dashboard")
@bp.route(route="dashboard", methods=["GET"], auth_level=func.AuthLevel.FUNCTION)
def page(req: func.HttpRequest) -> func.HttpResponse:
    return func.HttpResponse(dashboard.page(), mimetype="text/html", charset="utf-8",
                             headers={**NO_STORE, "Content-Security-Policy": CSP})


@bp.function_name("dashboard_state")
@bp.route(route="dashboard/api/state", methods=["GET"], auth_level=func.AuthLevel.FUNCTION)
def state(req: func.HttpRequest) -> func.HttpResponse:
    return context.http_json(lambda: dashboard.snapshot(context.storage(), context.settings(), context.caller(req)))


@bp.function_name("dashboard_job")
@bp.route(route="dashboard/api/jobs/{job_id}", methods=["GET"], auth_level=func.AuthLevel.FUNCTION)
def job(req: func.HttpRequest) -> func.HttpResponse:
    return context.http_json(lambda: dashboard.job_detail(context.job_api(req), req.route_params.get("job_id", ""),
                                                          req.params.get("after", "")))


@bp.function_name("dashboard_report")
@bp.route(route="dashboard/reports/{job_id}/{*path}", methods=["GET"], auth_level=func.AuthLevel.FUNCTION)
def report(req: func.HttpRequest) -> func.HttpResponse:
    return context.http_json(
        lambda: dashboard.report_file(context.job_api(req), req.route_params.get("job_id", ""),
                                      req.route_params.get("path", "") or "index.html"),
        missing="no such report file",
        render=lambda found: func.HttpResponse(found[0], mimetype=found[1].split(";")[0], headers=NO_STORE))
