"""Log output: plain text for a console, or one JSON object a line (`server.log_format: json`)
for a log pipeline, uvicorn's and vLLM's lines included."""

from __future__ import annotations

import copy
import json
import logging
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gateway.redaction import redact

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class RedactSecrets(logging.Filter):
    """Key-shaped text out of every line (a key a client put in a URL's query string, a model
    name, a header value an exception quotes): sparkgate never logs keys itself, this catches
    what others' text carries. The arguments are redacted one by one, so formatters that
    unpack them (uvicorn's access log) still can."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(redact(a) if isinstance(a, str) else a for a in record.args)
        elif isinstance(record.args, dict):
            record.args = {k: redact(v) if isinstance(v, str) else v for k, v in record.args.items()}
        return True


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
    handler.addFilter(RedactSecrets())
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level.upper())
    if fmt != "json":
        import uvicorn.config

        config = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)
        config.setdefault("filters", {})["redact"] = {"()": f"{__name__}.RedactSecrets"}
        for h in config["handlers"].values():
            h["filters"] = [*h.get("filters", []), "redact"]
        return config
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
        "filters": {"redact": {"()": f"{__name__}.RedactSecrets"}},
        "handlers": {
            "json": {
                "class": "logging.StreamHandler",
                "formatter": "json",
                "filters": ["redact"],
                "stream": "ext://sys.stderr",
            }
        },
        "loggers": {"vllm": {"handlers": ["json"], "level": level.upper(), "propagate": False}},
    }
