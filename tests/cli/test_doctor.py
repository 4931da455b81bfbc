"""`arlctl doctor` and `arlctl.doctor.preflight`: the real checks pass on a prepared host, and each one
fails for real when what it checks is taken away (bwrap off PATH, an interpreter without pytest, a
docker socket that does not exist, a disk threshold above the free space, vLLM absent, no model GGUF)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from arlctl import models
from arlctl.cli.main import app
from arlctl.doctor import CHECKS, FIX_BWRAP, FIX_PYTEST, DoctorOptions, preflight, run_checks
from arlctl.errors import UsageError

runner = CliRunner()
REPO = Path(__file__).resolve().parents[2]


def doctor(*args: str, env: dict[str, str] | None = None):
    return runner.invoke(app, ["doctor", *args], env=env)


def doctor_json(*args: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, dict]]:
    result = doctor(*args, "--json", env=env)
    checks = json.loads(result.stdout)
    return result.exit_code, {c["name"]: c for c in checks}


def docker_engine_up() -> bool:
    try:
        from arlctl.sandbox.docker import docker_client

        docker_client(timeout=5)
        return True
    except Exception:
        return False


def vllm_importable() -> bool:
    return subprocess.run([sys.executable, "-c", "import vllm"], capture_output=True).returncode == 0


@pytest.fixture
def no_pytest_python():
    """A sandbox interpreter without pytest: a launcher script for a `venv --without-pip` (no system site
    packages, so the distribution's python3-pytest is invisible). Under /var/tmp because the sandbox
    mounts its own /tmp over the host's, and world-readable because bwrap runs as nobody under root."""
    base = Path(tempfile.mkdtemp(prefix="arlctl-doctor-", dir="/var/tmp"))
    try:
        base.chmod(0o755)
        subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(base / "venv")], check=True)
        # Called by its venv path, so it finds its pyvenv.cfg (a bare symlink to venv/bin/python3 would not).
        launcher = base / "python3"
        launcher.write_text(f'#!/bin/sh\nexec {base}/venv/bin/python3 "$@"\n')
        launcher.chmod(0o755)
        yield str(launcher), str(base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_every_check_passes_or_is_skipped_on_this_host(tmp_path):
    code, checks = doctor_json("--run", str(tmp_path))
    assert code == 0, checks
    assert list(checks) == list(CHECKS)  # every check listed, in order
    assert {n: checks[n]["status"] for n in ("bwrap", "pytest", "cgroups", "disk")} == dict.fromkeys(
        ("bwrap", "pytest", "cgroups", "disk"), "ok")
    assert {n: checks[n]["status"] for n in ("docker", "docker-image", "vllm")} == dict.fromkeys(
        ("docker", "docker-image", "vllm"), "skip")
    assert checks["vllm"]["ok"] is None and "--backend vllm" in checks["vllm"]["detail"]
    assert checks["model"]["status"] == ("ok" if models.is_pulled() else "warn")
    assert "/usr/bin/python3 has pytest" in checks["pytest"]["detail"]
    assert all(set(c) == {"name", "ok", "detail", "fix", "required", "status"} for c in checks.values())


def test_human_output_is_one_line_per_check(tmp_path):
    result = doctor("--run", str(tmp_path))
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert [line.split()[1] for line in lines] == list(CHECKS)
    assert lines[0].startswith("ok    bwrap")


@pytest.mark.slow
def test_no_bwrap_on_path_fails_with_the_install_command(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("python", "python3"):
        (bin_dir / name).symlink_to(sys.executable)
    env = {**os.environ, "PATH": str(bin_dir)}
    r = subprocess.run([sys.executable, "-m", "arlctl.cli.main", "doctor", "--run", str(tmp_path)],
                       capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert r.returncode == 1, r.stderr
    lines = {line.split()[1]: line for line in r.stderr.splitlines() if line.split()[:1] in (["fail"], ["ok"])}
    assert lines["bwrap"].startswith("fail") and "not found on PATH" in lines["bwrap"]
    assert f"fix: {FIX_BWRAP}" in lines["bwrap"]
    assert lines["pytest"].startswith("fail") and "bwrap is missing" in lines["pytest"]
    assert lines["disk"].startswith("ok")
    assert "required check(s) failed: bwrap, pytest" in r.stderr


def test_interpreter_without_pytest_fails_the_pytest_check(no_pytest_python):
    launcher, base = no_pytest_python
    opts = DoctorOptions(python=launcher, ro_binds=[base])
    bwrap, pytest_check = run_checks(opts, ["bwrap", "pytest"])
    assert bwrap.status == "ok"  # the sandbox itself starts with this interpreter running its server
    assert pytest_check.status == "fail" and pytest_check.fix == FIX_PYTEST
    assert "No module named 'pytest'" in pytest_check.detail and launcher in pytest_check.detail
    with pytest.raises(UsageError) as err:
        preflight(["bwrap", "pytest"], opts)
    assert "preflight check pytest failed" in str(err.value) and FIX_PYTEST in err.value.hint


def test_same_launcher_on_the_system_python_passes(no_pytest_python):
    """Control for the test above: the launcher path and binds are not what breaks it, the venv is."""
    _, base = no_pytest_python
    launcher = Path(base) / "system-python3"
    launcher.write_text('#!/bin/sh\nexec /usr/bin/python3 "$@"\n')
    launcher.chmod(0o755)
    (result,) = run_checks(DoctorOptions(python=str(launcher), ro_binds=[base]), ["pytest"])
    assert result.status == "ok", result.detail
    assert [r.name for r in preflight(["pytest"], DoctorOptions(python=str(launcher), ro_binds=[base]))] == ["pytest"]


def test_docker_socket_that_does_not_exist_fails_with_the_setup_script(tmp_path):
    missing = tmp_path / "no-such-docker.sock"
    code, checks = doctor_json("--sandbox", "docker", "--run", str(tmp_path),
                               env={"DOCKER_HOST": f"unix://{missing}"})
    assert code == 1
    assert checks["docker"]["status"] == "fail" and str(missing) in checks["docker"]["detail"]
    assert ".ci/docker_setup.sh" in checks["docker"]["fix"]
    assert checks["docker-image"]["status"] == "fail" and ".ci/docker_setup.sh" in checks["docker-image"]["fix"]
    # The bwrap checks are not what --sandbox docker needs: skipped, not failed.
    assert {checks[n]["status"] for n in ("bwrap", "pytest", "cgroups")} == {"skip"}


@pytest.mark.skipif(not docker_engine_up(), reason="no docker engine")
def test_docker_engine_and_base_image_pass_and_a_missing_image_fails(tmp_path):
    code, checks = doctor_json("--sandbox", "docker", "--run", str(tmp_path), "--check", "docker",
                               "--check", "docker-image")
    assert code == 0, checks
    assert list(checks) == ["docker", "docker-image"] and checks["docker-image"]["status"] == "ok"
    code, checks = doctor_json("--sandbox", "docker", "--image", "arlctl/no-such-image:0", "--check", "docker-image")
    assert code == 1 and checks["docker-image"]["status"] == "fail"
    assert "arlctl/no-such-image:0" in checks["docker-image"]["detail"]


def test_too_little_free_disk_fails(tmp_path):
    code, checks = doctor_json("--run", str(tmp_path / "not" / "made"), "--min-free-gb", "1e9", "--check", "disk")
    assert code == 1
    disk = checks["disk"]
    assert disk["status"] == "fail" and str(tmp_path) in disk["detail"] and "minimum 1e+09 GB" in disk["detail"]
    assert "--run" in disk["fix"]
    code, checks = doctor_json("--run", str(tmp_path), "--min-free-gb", "0.001", "--check", "disk")
    assert code == 0 and checks["disk"]["status"] == "ok"


@pytest.mark.skipif(vllm_importable(), reason="vLLM is installed here")
def test_backend_vllm_without_vllm_fails():
    code, checks = doctor_json("--backend", "vllm", "--check", "vllm")
    assert code == 1 and checks["vllm"]["status"] == "fail"
    assert "No module named 'vllm'" in checks["vllm"]["detail"] and "arlctl[vllm]" in checks["vllm"]["fix"]


def test_model_not_converted_warns_and_a_missing_gguf_fails(tmp_path):
    home = str(tmp_path / "home")
    code, checks = doctor_json("--check", "model", env={"ARLCTL_HOME": home})
    assert code == 0  # the first rollout converts it: a warning, not a failure
    assert checks["model"]["status"] == "warn" and checks["model"]["fix"] == "arlctl model pull"
    gguf = str(tmp_path / "missing.gguf")
    code, checks = doctor_json("--check", "model", env={"ARLCTL_HOME": home, "ARLCTL_SMOLLM2_GGUF": gguf})
    assert code == 1 and checks["model"]["status"] == "fail" and gguf in checks["model"]["detail"]


def test_unknown_names_are_usage_errors():
    assert doctor("--check", "bogus").exit_code == 2
    assert doctor("--sandbox", "chroot").exit_code == 2
    with pytest.raises(UsageError):
        preflight(["bogus"])


@pytest.mark.slow
@pytest.mark.parametrize("command", ["rollout", "reward"])
def test_stages_run_the_checks_before_any_work(tmp_path, command):
    """A swe rollout or grading on docker with no engine: one usage error naming the check and its fix,
    before any shard is read or written (the stages run the doctor's own checks)."""
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path / 'no-engine.sock'}"}
    (tmp_path / "rollouts").mkdir()  # an input that exists (a missing one is refused before the preflight)
    args = (["rollout", "--env", "swe", "--tasks", "builtin:swe?ids=stockroom-001", "--policy", "oracle:gold",
             "--sandbox", "docker", "--out", str(tmp_path / "out")] if command == "rollout" else
            ["reward", "--in", str(tmp_path / "rollouts"), "--out", str(tmp_path / "rewarded"), "--reward", "swe",
             "--reward-opt", "sandbox=docker"])
    result = subprocess.run([sys.executable, "-m", "arlctl.cli.main", *args], capture_output=True, text=True,
                            env=env, timeout=300)
    assert result.returncode == 2, result.stderr
    assert "preflight check docker failed" in result.stderr and ".ci/docker_setup.sh" in result.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "rewarded").exists()


def test_stage_checks_preflight_the_code_graders_sandbox():
    from arlctl.doctor import stage_checks

    assert stage_checks("code", None, grading=True) == ["bwrap"]  # every grade runs in a fresh bwrap sandbox
    assert stage_checks("code", "docker", grading=True) == []
    assert stage_checks("code", None) == []  # a single-turn rollout runs no sandbox


def test_the_train_line_reports_this_hosts_device_and_fast_paths():
    import torch

    from arlctl.doctor import train_paths

    code, checks = doctor_json("--check", "train")
    assert code == 0 and checks["train"]["status"] == "ok"
    paths = train_paths()
    assert paths["torch"] == torch.__version__ and paths["gpus"] == torch.cuda.device_count()
    if torch.cuda.is_available():  # a lent GPU machine: NCCL, bf16 and the CUDA version are reported
        assert paths["backend"] == "nccl" and paths["cuda"] == torch.version.cuda
        assert f"NCCL {paths['nccl']}" in checks["train"]["detail"]
    else:  # this CPU: gloo, fp32 and SDPA per packed row (packing.ROWS), nothing CUDA-only claimed
        assert (paths["backend"], paths["precision"], paths["attention"], paths["cuda"]) == (
            "gloo", "fp32", "arlctl_rows", None)
        assert "no CUDA" in checks["train"]["detail"] and "packed attention arlctl_rows" in checks["train"]["detail"]
    assert f"LM head in {paths['head_chunk_mb']} MiB chunks" in checks["train"]["detail"]
