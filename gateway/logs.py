"""Log output: plain text for a console, or one JSON object a line (`server.log_format: json`)
for a log pipeline, uvicorn's and vLLM's lines included."""

from __future__ import annotations

import json
import logging
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """A record as one JSON line: time, level, logger, message; a record with `fields` (the
    request log) carries them at the top level."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            out["msg"] = getattr(record, "event", "request")
            out |= fields
        else:
            out["msg"] = record.getMessage()
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


def configure(level: str, fmt: str, cache_dir: Path) -> dict[str, Any] | None:
    """Set up the root handler; return the `log_config` uvicorn should apply (None: none, its
    loggers then reach the root handler)."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level.upper())
    if fmt != "json":
        import uvicorn.config

        return dict(uvicorn.config.LOGGING_CONFIG)
    logging.captureWarnings(True)  # Python warnings as log records, so JSON too
    # vLLM configures its own handler (in its engine processes too): give it this formatter.
    # What libraries print themselves stays as it is: C++ warnings, progress bars, print().
    if "VLLM_LOGGING_CONFIG_PATH" not in os.environ:
        cache_dir.mkdir(parents=True, exist_ok=True)
        path = cache_dir / "vllm-logging.json"
        path.write_text(json.dumps(vllm_logging_config(level)))
        os.environ["VLLM_LOGGING_CONFIG_PATH"] = str(path)
    return None


def vllm_logging_config(level: str) -> dict[str, Any]:
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": f"{__name__}.JsonFormatter"}},
        "handlers": {"json": {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stderr"}},
        "loggers": {"vllm": {"handlers": ["json"], "level": level.upper(), "propagate": False}},
    }
