"""The one policy resolver (stages/policy_job.py): a spec is resolved once, checked before anything is loaded,
and rollout, eval and serve take their policy options from one declaration with one default each."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
import typer.main

from arlctl.cli.main import app
from arlctl.cli.options import option_defaults
from arlctl.errors import UsageError
from arlctl.models import tiny_model_dir
from arlctl.settings import flag_of
from arlctl.stages import policy_job
from arlctl.stages.jobs import PolicyOptions


def publish(policy_dir, version: int) -> None:
    dest = policy_dir / f"v{version:06d}"
    shutil.copytree(tiny_model_dir(), dest)
    (dest / "version.json").write_text(json.dumps({"version": version, "step": version, "sha256": "x"}))
    (policy_dir / "LATEST").write_text(dest.name)


@pytest.mark.slow
def test_the_policy_loaded_is_the_one_chosen_even_when_latest_moves_in_between(tmp_path):
    policy_dir = tmp_path / "policy"
    publish(policy_dir, 1)
    choice = policy_job.choose(PolicyOptions(policy=str(policy_dir), max_batch=4), progress=False)
    publish(policy_dir, 2)  # sync publishes between the check and the load
    pol = policy_job.load(choice)
    assert (choice.version, pol.version) == (1, 1)  # resolved once: the load did not look at LATEST again
    assert pol.max_batch == 4


@pytest.mark.parametrize(("opts", "message"), [
    (PolicyOptions(policy="no/such/dir"), "not found"),
    (PolicyOptions(policy="tiny", backend="tgi"), "unknown inference backend 'tgi'"),
    (PolicyOptions(policy="tiny", backend_opt=["max_batch"]), "--backend-opt expects KEY=VALUE"),
    (PolicyOptions(policy="tiny", max_batch=0), "--max-batch must be at least 1"),
])
def test_a_wrong_policy_option_is_a_usage_error_before_any_load(opts, message):
    with pytest.raises(UsageError, match=message):
        policy_job.choose(opts, progress=False)


def test_a_scripted_spec_is_chosen_without_a_model_and_refused_where_one_is_needed():
    choice = policy_job.choose(PolicyOptions(policy="oracle:gold"))
    assert choice.scripted and choice.version == 0
    with pytest.raises(UsageError, match="scripted policy"):
        policy_job.choose(PolicyOptions(policy="oracle:gold"), scripted_ok=False)


def test_the_openai_backend_reads_the_runs_fleet_file_unless_a_server_is_given(tmp_path):
    run = str(tmp_path / "run")
    fleet = tmp_path / "run" / "fleet.json"
    assert policy_job.backend_options(PolicyOptions(backend="openai"), run)["servers_file"] == str(fleet)
    given = PolicyOptions(backend="openai", server=["http://127.0.0.1:9"])
    assert "servers_file" not in policy_job.backend_options(given, run)  # no fleet file there: the server alone
    assert policy_job.backend_options(given, None)["servers"] == ["http://127.0.0.1:9"]


def test_serve_rollout_and_eval_share_one_max_batch_default_and_help():
    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    field = next(f for f in dataclasses.fields(PolicyOptions) if f.name == "max_batch")
    for name in ("rollout", "serve"):
        param = next(p for p in commands[name].params if flag_of(field) in p.opts)
        assert option_defaults(commands[name])[flag_of(field)] == ("max_batch", field.default), name
        assert param.help == field.metadata["help"], name
