"""Settings and storage, read once per process at the edge of the Function App."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import TypeVar

import azure.functions as func

from upwell import logs
from upwell.access import principal
from upwell.access.principal import Caller
from upwell.errors import PrincipalInvalid, ProjectForbidden, UpwellError
from upwell.jobviews import JobViews
from upwell.ops.jobapi import JobAPI
from upwell.settings import Settings
from upwell.storage import Storage

T = TypeVar("T")
log = logs.get("handlers")


@functools.cache
def settings() -> Settings:
    logs.configure()  # JSON, unless UPWELL_LOG_FORMAT=console (upwell up on a terminal)
    return Settings.from_env()


@functools.cache
def storage() -> Storage:
    """The account's clients. Nothing is created here: on Azure the templates create every container, queue
    and table (bicep/modules/storage.bicep), and locally the stack does before the host starts (upwell.local.stack);
    creating them again would cost each instance's first call 19 requests."""
    return Storage(settings().connection)


@functools.cache
def job_views() -> JobViews:
    """The job views this process keeps between collect's finishes (upwell.jobviews): first tries only."""
    return JobViews()


def settle(what: str, call: Callable[[], T]) -> T | None:
    """Run a handler's one call into upwell. A permanent upwell error is logged and dropped (retrying
    the same input cannot help; the reconciler re-drives what needs it); a transient one raises, so
    the host redelivers the trigger."""
    try:
        return call()
    except UpwellError as exc:
        if not exc.permanent:
            raise
        log.error(f"handlers.{what}_dropped", error=str(exc)[:500], code=exc.code, kind=type(exc).__name__)
        return None


def reset() -> None:
    """Forget the cached settings and clients (tests change the environment)."""
    settings.cache_clear()
    storage.cache_clear()
    job_views.cache_clear()



def caller(req) -> Caller:
    """Who sent an HTTP request (``upwell.access.principal``): the signed-in principal, else automation on a key.
    An action that a browser marks cross-site (``Sec-Fetch-Site``) is refused: another site's page must not
    cancel jobs with the sign-in cookie of someone who visits it. Scripts send no such header."""
    if req.method.upper() not in ("GET", "HEAD") and \
            (req.headers.get("sec-fetch-site") or "").lower() == "cross-site":
        raise ProjectForbidden("a cross-site request may not act on jobs: use the dashboard or the API itself")
    return principal.caller(req.headers, req.params, settings().project_roles, route=req.url.split("?", 1)[0],
                            method=req.method)


def job_api(req) -> JobAPI:
    """The jobs as the request's caller may see them (the caller first: a refused one opens no storage)."""
    who = caller(req)
    return JobAPI(storage(), settings(), who)


def http_json(call: Callable[[], object], *, missing: str = "no such job",
              render: Callable[[object], func.HttpResponse] | None = None) -> func.HttpResponse:
    """Run an HTTP function's one call: its value as JSON, or through ``render`` (None: 404 ``missing``); a bad
    principal 401, another project's job 403, any other refusal 409, each with the reason (a transient
    error raises: the host answers 500)."""
    try:
        value = call()
    except PrincipalInvalid as exc:
        return _json({"error": str(exc)}, 401)
    except ProjectForbidden as exc:
        return _json({"error": str(exc)}, 403)
    except UpwellError as exc:
        if not exc.permanent:
            raise
        return _json({"error": str(exc)}, 409)
    if value is None:
        return _json({"error": missing}, 404)
    return render(value) if render is not None else _json(value)


def _json(body: object, status: int = 200) -> func.HttpResponse:
    return func.HttpResponse(json.dumps(body, default=str, indent=1), status_code=status,
                             mimetype="application/json", headers={"Cache-Control": "no-store"})
