"""Python logging on top of the Rust tracing subscriber.

:func:`configure_dynamo_logging` routes the root logger through :class:`LogHandler`, which
hands each formatted record to :func:`dynamo._core.log_message`; the Rust subscriber
(installed when :mod:`dynamo._core` is imported) applies the ``DYN_LOG`` filter and writes
text or, with ``DYN_LOGGING_JSONL=1``, JSON lines to stderr.
"""

from __future__ import annotations

import json
import logging
import logging.config
import os
import tempfile
from datetime import datetime, timezone

from dynamo._core import log_message

__all__ = [
    "LogHandler",
    "VllmColorFormatter",
    "configure_dynamo_logging",
    "configure_logger",
    "configure_sglang_logging",
    "configure_vllm_logging",
    "construct_formatter_prefix",
    "get_bool_env_var",
    "log_level_mapping",
    "python_log_level_mapping",
]

_logger = logging.getLogger(__name__)


def _target(record: logging.LogRecord) -> str:
    if not record.funcName or record.funcName == "<module>":
        return record.module
    return f"{record.module}.{record.funcName}"


class LogHandler(logging.Handler):
    """Forward records to the Rust tracing subscriber."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = self.format(record)
            log_message(
                record.levelname.lower(), message, _target(record), record.pathname, record.lineno
            )
        except Exception:
            self.handleError(record)


_DIM = "\033[2m"
_RESET = "\033[0m"
_COLORS = {
    logging.DEBUG: _DIM,
    logging.INFO: "\033[32m",
    logging.WARNING: "\033[33m",
    logging.ERROR: "\033[31m",
}


class VllmColorFormatter(logging.Formatter):
    """``ts level target: message`` with ANSI colours, timestamps in UTC."""

    def format(self, record: logging.LogRecord) -> str:
        ts = datetime.fromtimestamp(record.created, tz=timezone.utc).strftime(
            "%Y-%m-%dT%H:%M:%S.%fZ"
        )
        color = _COLORS.get(record.levelno, "")
        level = f"{color}{record.levelname:>5}{_RESET}" if color else f"{record.levelname:>5}"
        message = record.getMessage()
        if record.exc_info:
            message += "\n" + self.formatException(record.exc_info)
        return (
            f"{_DIM}{ts}{_RESET} {level} {_DIM}{_target(record)}{_RESET}{_DIM}:{_RESET} {message}"
        )


class _HealthCheckFilter(logging.Filter):
    """Drop debug records of health checks."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.funcName == "check_health" and record.levelno <= logging.DEBUG)


def construct_formatter_prefix(service_name: str | None, worker_id: int | None) -> str:
    """``"service:worker"`` from the parts that are given, stripped."""
    prefix = service_name or ""
    if worker_id is not None:
        prefix += f":{worker_id}"
    return prefix.strip()


def configure_logger(
    service_name: str | None, worker_id: int | None, level: int = logging.INFO
) -> None:
    """Add a :class:`LogHandler` to the root logger and set its level."""
    handler = LogHandler()
    prefix = construct_formatter_prefix(service_name, worker_id)
    handler.setFormatter(logging.Formatter(f"[{prefix}] %(message)s" if prefix else "%(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(level)


def log_level_mapping(level: str) -> int:
    """Map a ``DYN_LOG`` level name to a Python level (unknown → INFO)."""
    return {
        "debug": logging.DEBUG,
        "info": logging.INFO,
        "warn": logging.WARNING,
        "warning": logging.WARNING,
        "error": logging.ERROR,
        "critical": logging.CRITICAL,
        "trace": logging.INFO,
    }.get(level, logging.INFO)


_FILTER_LEVELS = {
    "trace": logging.DEBUG,
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "off": logging.CRITICAL + 10,
}


def python_log_level_mapping(filters: str) -> int:
    """The most verbose Python level any directive of a ``DYN_LOG`` filter enables.

    ``"warn,dynamo_runtime=debug"`` → DEBUG; trace counts as DEBUG; empty or unknown → INFO.
    """
    levels = []
    for directive in (filters or "").split(","):
        directive = directive.strip()
        if not directive:
            continue
        level = directive.rsplit("=", 1)[-1].strip().lower()
        if level in _FILTER_LEVELS:
            levels.append(_FILTER_LEVELS[level])
    return min(levels) if levels else logging.INFO


def get_bool_env_var(name: str, default: str = "false") -> bool:
    """Read a boolean environment variable ("true"/"1" or "false"/"0")."""
    value = os.getenv(name, default).lower()
    if value in ("true", "1"):
        return True
    if value in ("false", "0"):
        return False
    _logger.warning("invalid boolean value %r for %s; using False", value, name)
    return False


def configure_sglang_logging(dyn_level: int) -> None:
    """Write a logging config routing sglang through :class:`LogHandler` and point
    ``SGLANG_LOGGING_CONFIG_PATH`` at it (sglang applies it itself)."""
    level = logging.getLevelName(dyn_level)
    config = {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"simple": {"format": "%(message)s"}},
        "handlers": {
            "dynamo": {
                "class": "dynamo.runtime.logging.LogHandler",
                "formatter": "simple",
                "level": level,
            }
        },
        "loggers": {
            name: {"handlers": ["dynamo"], "level": level, "propagate": False}
            for name in ("sglang", "gpu_memory_service")
        },
    }
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(config, f)
    os.environ["SGLANG_LOGGING_CONFIG_PATH"] = f.name


def configure_vllm_logging(dyn_level: int) -> None:
    """Route vLLM's loggers to stderr with :class:`VllmColorFormatter`.

    The level comes from ``VLLM_LOGGING_LEVEL`` (default INFO); ``dyn_level`` is unused,
    as in the reference.
    """
    del dyn_level
    os.environ["VLLM_CONFIGURE_LOGGING"] = "1"
    level = os.environ.get("VLLM_LOGGING_LEVEL", "INFO").upper()
    logging.config.dictConfig(
        {
            "version": 1,
            "disable_existing_loggers": False,
            "formatters": {"vllm": {"()": VllmColorFormatter}},
            "handlers": {
                "vllm": {
                    "class": "logging.StreamHandler",
                    "formatter": "vllm",
                    "level": level,
                    "stream": "ext://sys.stderr",
                }
            },
            "loggers": {
                name: {"handlers": ["vllm"], "level": level, "propagate": False}
                for name in ("vllm", "gpu_memory_service")
            },
        }
    )
    engine_logger = logging.getLogger("vllm.v1.engine.async_llm")
    if not any(isinstance(f, _HealthCheckFilter) for f in engine_logger.filters):
        engine_logger.addFilter(_HealthCheckFilter())


def configure_dynamo_logging(service_name: str | None = None, worker_id: int | None = None) -> None:
    """Send Python logging through the Rust subscriber, at the level ``DYN_LOG`` enables."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    level = python_log_level_mapping(os.environ.get("DYN_LOG", "info"))
    configure_logger(service_name, worker_id, level)
    configure_vllm_logging(level)
    if not get_bool_env_var("DYN_SKIP_SGLANG_LOG_FORMATTING"):
        configure_sglang_logging(level)
    tag = logging.getLogger("tag")
    tag.handlers.clear()
    tag.setLevel(logging.ERROR)
    tag.propagate = True
