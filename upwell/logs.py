"""structlog configuration: JSON lines, with secrets redacted from every event."""

from __future__ import annotations

import logging
import os
import re
import sys

import structlog

_SECRETS = [
    (re.compile(r"(AccountKey=)[^;\s\"']+", re.I), r"\1***"),
    (re.compile(r"(SharedAccessSignature\s*=\s*)[^;\s\"']+", re.I), r"\1***"),
    (re.compile(r"([?&]sig=)[^&\s\"']+", re.I), r"\1***"),
    (re.compile(r"(\"?(?:account_?key|password|client_secret)\"?\s*[:=]\s*\"?)[^\s\",;]+", re.I), r"\1***"),
]
# Event keys whose value is a secret whatever it looks like (a bare account key has no "AccountKey=").
_SECRET_KEYS = re.compile(r"(?i)(account_?key|password|secret|sas_?token|credential|connection_?string|^key$)")


def redact_text(text: str) -> str:
    for pattern, repl in _SECRETS:
        text = pattern.sub(repl, text)
    return text


def _scrub(value, depth: int = 0):
    """Redact strings inside dicts, lists and tuples too (a config dict, a list of URLs)."""
    if isinstance(value, str):
        return redact_text(value)
    if depth > 8:
        return value
    if isinstance(value, dict):
        return {k: "***" if isinstance(k, str) and _SECRET_KEYS.search(k) and value[k] else _scrub(v, depth + 1)
                for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_scrub(v, depth + 1) for v in value)
    if isinstance(value, BaseException):
        return redact_text(repr(value))
    return value


def redact(_logger, _name, event: dict) -> dict:
    """structlog processor: scrub connection-string keys, SAS signatures and secrets, at any depth."""
    return _scrub(event)


def _redact_stdlib() -> None:
    """The same scrubbing for stdlib log records (the Azure SDK and the devhost log through them):
    each record's message is formatted and redacted when the record is made."""
    base = logging.getLogRecordFactory()
    if getattr(base, "upwell_redacts", False):
        return

    def factory(*args, **kwargs) -> logging.LogRecord:
        record = base(*args, **kwargs)
        try:
            record.msg, record.args = redact_text(record.getMessage()), None
        except Exception:  # noqa: BLE001 - a message that does not format is left for logging to report
            pass
        return record

    factory.upwell_redacts = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)


class _StderrLogger:
    """Writes each line to whatever ``sys.stderr`` is when it writes. structlog's PrintLogger keeps
    the stream it was given, so a swapped stderr (a test's capture, typer's CliRunner) that was
    closed since would make every later log line raise "I/O operation on closed file"."""

    def __init__(self, *_args) -> None:
        pass

    def msg(self, message: str) -> None:
        try:
            print(message, file=sys.stderr, flush=True)
        except ValueError:  # stderr was closed under us: the line has nowhere to go
            pass

    log = debug = info = warning = warn = error = critical = exception = fatal = failure = err = msg


_configured = False


def configure(*, pretty: bool | None = None, level: int = logging.INFO) -> None:
    """JSON to stderr by default; readable console output when ``pretty`` (a terminal)."""
    global _configured
    # UPWELL_LOG_LEVEL (e.g. "error") quiets a whole run, as the benchmarks do.
    named = logging.getLevelName(os.environ.get("UPWELL_LOG_LEVEL", "").upper())
    level = named if isinstance(named, int) else level
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
        logger_factory=_StderrLogger,
        cache_logger_on_first_use=False,
    )
    logging.getLogger("azure").setLevel(logging.WARNING)
    _redact_stdlib()
    _configured = True


def get(name: str = "upwell", **bound):
    if not _configured:
        configure()
    return structlog.get_logger(name).bind(**bound)
