"""structlog configuration: JSON lines, with secrets redacted from every event."""

from __future__ import annotations

import logging
import os
import re
import sys

import structlog

_SECRETS = [
    (re.compile(r"(AccountKey=)[^;\s\"']+", re.I), r"\1***"),
    (re.compile(r"(SharedAccessSignature=)[^;\s\"']+", re.I), r"\1***"),
    (re.compile(r"([?&]sig=)[^&\s\"']+", re.I), r"\1***"),
    (re.compile(r"(\"?(?:account_?key|password|client_secret)\"?\s*[:=]\s*\"?)[^\s\",;]+", re.I), r"\1***"),
]


def redact_text(text: str) -> str:
    for pattern, repl in _SECRETS:
        text = pattern.sub(repl, text)
    return text


def redact(_logger, _name, event: dict) -> dict:
    """structlog processor: scrub connection-string keys, SAS signatures and secrets."""
    for key, value in list(event.items()):
        if isinstance(value, str):
            event[key] = redact_text(value)
    return event


_configured = False


def configure(*, pretty: bool | None = None, level: int = logging.INFO) -> None:
    """JSON to stderr by default; readable console output when ``pretty`` (a terminal)."""
    global _configured
    if pretty is None:
        fmt = os.environ.get("UPWELL_LOG_FORMAT", "").lower()
        pretty = fmt == "console" or (fmt != "json" and sys.stderr.isatty())
    renderer = structlog.dev.ConsoleRenderer(colors=True) if pretty else structlog.processors.JSONRenderer()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            redact,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    logging.getLogger("azure").setLevel(logging.WARNING)
    _configured = True


def get(name: str = "upwell", **bound):
    if not _configured:
        configure()
    return structlog.get_logger(name).bind(**bound)
