"""`sparkgate serve | prepare-models | hash-key`."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(
    add_completion=False, no_args_is_help=True, help="sparkgate: OpenAI-compatible gateway over in-process vLLM."
)

DEFAULT_CONFIG = "config/default.yaml"


@app.command()
def serve(
    config: Annotated[Path, typer.Option("--config", "-c", help="YAML config file")] = Path(DEFAULT_CONFIG),
    host: Annotated[str | None, typer.Option(help="Override server.host")] = None,
    port: Annotated[int | None, typer.Option(help="Override server.port")] = None,
) -> None:
    """Start the engines and serve the OpenAI API."""
    import uvicorn

    from gateway import runtime_env
    from gateway.settings import load_settings
    from policies.memory_plan import PlanDoesNotFit

    try:
        settings = load_settings(config)
    except (OSError, ValueError) as e:  # pydantic's ValidationError is a ValueError
        typer.echo(f"sparkgate: invalid config {config}:\n{e}", err=True)
        raise typer.Exit(2) from None
    if missing := settings.missing_model_dirs():
        lines = "\n  ".join(missing)
        typer.echo(
            f"sparkgate: cannot serve:\n  {lines}\n"
            "Build the embedded default models with `make models`, or point `path` at a model directory.",
            err=True,
        )
        raise typer.Exit(2)
    plan = settings.memory_plan()
    if isinstance(plan, PlanDoesNotFit):
        typer.echo(f"sparkgate: cannot serve: {plan.message}", err=True)
        raise typer.Exit(2)
    if plan is not None:
        settings = settings.with_kv_plan(plan)
        typer.echo("sparkgate: memory plan\n" + "\n".join(plan.lines), err=True)
    server = settings.server.model_copy(update={k: v for k, v in {"host": host, "port": port}.items() if v is not None})
    runtime_env.configure(Path(settings.base_dir) / server.cache_dir)
    logging.basicConfig(level=server.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from gateway.app import create_app

    uvicorn.run(
        create_app(settings),
        host=server.host,
        port=server.port,
        log_level=server.log_level,
        timeout_graceful_shutdown=5,
        timeout_keep_alive=int(server.keep_alive_s),
    )


@app.command("prepare-models")
def prepare_models(
    root: Annotated[Path, typer.Option(help="Where model dirs go")] = Path("models"),
    force: Annotated[bool, typer.Option(help="Rebuild even if present")] = False,
) -> None:
    """Build the tiny local models (real Qwen tokenizer, random weights); no download."""
    from engine_adapter.tiny_model import prepare

    for path in prepare(root, force=force):
        typer.echo(f"ready: {path}")


@app.command("hash-key")
def hash_key_cmd(key: str) -> None:
    """Print the sha256 of an API key, the form `auth.keys[].sha256` stores."""
    from gateway.settings import hash_key

    typer.echo(hash_key(key))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
