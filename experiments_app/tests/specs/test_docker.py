"""coder-eval's `sandbox.driver: docker` and `sandbox.docker` block: every key taken as coder-eval
0.12.16 takes it, or refused by name at its line; the build context travels in the bundle."""

import os
import textwrap
from pathlib import Path

import pytest
from pydantic import ValidationError

from experiments_app.specs import TaskOverlay, TaskSpec
from experiments_app.specs.bundles import read_bundle
from experiments_app.specs.docker import build_context, image_key
from experiments_app.specs.loading import load_tasks
from experiments_app.specs.resolve import OverrideError, ResolveError, parse_overrides, resolve, trial_layers

CRITERION = {"type": "file_exists", "path": "out.txt"}
DOCKERFILE = "FROM debian:bookworm-slim\nWORKDIR /app\nCOPY data.txt /app/data.txt\n"


def task(**fields):
    return TaskSpec.model_validate(
        {"task_id": "t", "initial_prompt": "Do it.", "success_criteria": [CRITERION], **fields}
    )


def boxed(docker=None, **sandbox):
    return task(
        sandbox={"driver": "docker", "docker": docker or {"image": "debian:bookworm-slim"}, **sandbox}
    )


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def docker_task(
    folder: Path, docker: str = "dockerfile_path: environment/Dockerfile", extra: str = ""
) -> Path:
    """A container task with its build context in environment/ (two files). Its `docker` block
    starts on line 7, its criteria on the line after it; `extra` lines follow them."""
    write(folder / "environment" / "Dockerfile", DOCKERFILE)
    write(folder / "environment" / "data.txt", "42\n")
    lines = ["task_id: boxed", 'initial_prompt: "Read data.txt."', "sandbox:", "  driver: docker"]
    lines += ["  python: null", "  docker:", *("    " + line for line in docker.splitlines())]
    lines += ["success_criteria:", "  - type: file_exists", "    path: out.txt", *extra.splitlines()]
    path = folder / "task.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def only_error(result) -> str:
    assert len(result.errors) == 1, [str(e) for e in result.errors]
    return str(result.errors[0])


# --- the model ------------------------------------------------------------------------------------


def test_it_takes_a_container_task_with_an_image_or_a_dockerfile():
    image = boxed(
        {
            "image": "debian:bookworm-slim",
            "working_dir": "/app",
            "user": "1000:1000",
            "env": {"LANG": "C.UTF-8"},
            "build_timeout": 120,
        }
    )
    built = boxed(
        {
            "dockerfile_path": "environment/Dockerfile",
            "build": {
                "buildkit": True,
                "args": {"VERSION": "1.2"},
                "secrets": ["id=token,env=TOKEN"],
                "extra_args": ["--target", "runtime"],
            },
            "working_dir": "auto",
            "network": "none",
        }
    )

    assert image.sandbox.driver == "docker" and image.sandbox.docker.image == "debian:bookworm-slim"
    assert image.sandbox.docker.working_dir == "/app" and image.sandbox.docker.user == "1000:1000"
    assert built.sandbox.docker.build.args == {"VERSION": "1.2"}
    assert built.sandbox.docker.build.extra_args == ["--target", "runtime"]
    assert built.model_dump(mode="json", exclude_unset=True)["sandbox"]["docker"]["build"]["buildkit"] is True


def test_it_accepts_a_cpu_cap_only_for_a_container():
    assert boxed(limits={"max_cpus": 1.5}).sandbox.limits.max_cpus == 1.5
    with pytest.raises(ValidationError, match="is not built for the namespace sandbox.*driver: docker"):
        task(sandbox={"limits": {"max_cpus": 1.5}})
    # An experiment layer may cap the CPUs of the container tasks it switches to docker.
    assert TaskOverlay.model_validate({"driver": "docker", "sandbox": {"limits": {"max_cpus": 2}}})


@pytest.mark.parametrize(
    ("sandbox", "says"),
    [
        ({"driver": "docker"}, "coder-eval-agent:<version> is built from coder-eval's source"),
        ({"driver": "docker", "docker": {"imgae": "x"}}, "sandbox.docker holds unknown keys: 'imgae'"),
        ({"driver": "docker", "docker": {"network": "bridge", "image": "x"}}, "open internet in coder-eval"),
        (
            {
                "driver": "docker",
                "docker": {"network": "none", "image": "x"},
                "network": "bridge",
                "allowed_hosts": ["pypi.org"],
            },
            "disagrees with sandbox.network: bridge",
        ),
        (
            {"driver": "docker", "docker": {"image": "x"}, "python": {"env_packages": ["rich"]}},
            "in the Dockerfile",
        ),
        (
            {"driver": "docker", "docker": {"image": "x"}, "node": {"env_packages": ["is-number"]}},
            "npm install",
        ),
        ({"driver": "docker", "docker": {"image": "Not An Image"}}, "is not a Docker image reference"),
        ({"driver": "docker", "docker": {"image": "x", "working_dir": "app"}}, "must be an absolute path"),
        ({"driver": "docker", "docker": {"image": "x", "working_dir": "/"}}, "keeps for itself"),
        ({"driver": "docker", "docker": {"image": "x", "working_dir": "/logs/agent"}}, "keeps for itself"),
        ({"driver": "docker", "docker": {"image": "x", "working_dir": "/app/../etc"}}, "written plainly"),
        ({"driver": "docker", "docker": {"dockerfile_path": "/srv/Dockerfile"}}, "must be relative"),
        (
            {"driver": "docker", "docker": {"image": "x", "env": {"EVALSITE_TRIAL_ID": "1"}}},
            "set by the worker",
        ),
        ({"driver": "docker", "docker": {"image": "x", "env": {"A-B": "1"}}}, "is not a variable name"),
        ({"driver": "docker", "docker": {"image": "x", "user": "root; rm"}}, "must be a user name or uid"),
        ({"driver": "docker", "docker": {"image": "x", "build_timeout": 0}}, "greater than or equal to 1"),
    ],
)
def test_it_refuses_a_container_it_cannot_run_as_asked(sandbox, says):
    with pytest.raises(ValidationError, match=says.replace("(", r"\(").replace(")", r"\)")):
        task(sandbox=sandbox)


@pytest.mark.parametrize(
    ("build", "says"),
    [
        ({"args": {"VERSION": "${BUILD_VERSION}"}}, "expands it from the host's environment"),
        ({"args": {"HOME_DIR": "$HOME/x"}}, "expands it from the host's environment"),
        ({"args": {"1BAD": "x"}}, "is not a variable name"),
        ({"secrets": ["id=token,src=/root/.token"]}, "reads a file of the worker's"),
        ({"secrets": ["id=token,type=file"]}, "reads a file of the worker's"),
        ({"secrets": ["id=token"]}, "name the worker's variable"),
        ({"secrets": ["env=TOKEN"]}, "give an id"),
        ({"secrets": ["id=token,env=TOKEN"], "buildkit": False}, "need BuildKit"),
        ({"extra_args": ["--network", "host"]}, "docker build flag '--network' is refused"),
        ({"extra_args": ["--build-context", "x=/etc"]}, "docker build flag '--build-context' is refused"),
        ({"extra_args": ["--target"]}, "docker build flag '--target' is refused"),
    ],
)
def test_it_refuses_build_settings_that_reach_the_worker(build, says):
    with pytest.raises(ValidationError, match=says):
        boxed({"dockerfile_path": "environment/Dockerfile", "build": build})


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("env_passthrough", ["ANTHROPIC_API_KEY"]),
        ("env_passthrough_extra", ["MY_TOKEN"]),
        ("extra_mounts", ["/data:/data:ro"]),
    ],
)
def test_it_refuses_by_name_what_hands_the_worker_to_a_container(key, value):
    with pytest.raises(ValidationError, match=f"coder-eval's sandbox.docker.{key} .* is refused"):
        boxed({"image": "x", key: value})
    # Empty, they ask for nothing.
    assert boxed({"image": "x", key: []}).sandbox.docker.image == "x"


def test_it_keeps_container_only_criteria_and_oracle_scripts_to_container_tasks():
    verifier = {"type": "verifier"}
    with pytest.raises(ValidationError, match="a verifier criterion runs inside the task's container"):
        task(success_criteria=[verifier])
    with pytest.raises(ValidationError, match="the oracle runs reference.script inside the task's container"):
        task(reference={"directory": "solution", "script": "solve.sh"})
    spec = task(
        sandbox={"driver": "docker", "docker": {"image": "x"}},
        success_criteria=[verifier],
        reference={"directory": "solution", "script": "solve.sh"},
    )
    assert spec.success_criteria[0].pass_threshold == 1.0 and spec.success_criteria[0].timeout == 600


def test_it_leaves_the_docker_block_alone_under_tempdir_as_coder_eval_does():
    spec = task(sandbox={"docker": {"image": "python:3.12"}})

    assert spec.sandbox.driver == "tempdir" and spec.sandbox.docker.image == "python:3.12"


# --- layers and overrides -------------------------------------------------------------------------


def test_it_lets_an_experiment_switch_tasks_to_a_container_it_names():
    task_layer = {
        "task_id": "t",
        "initial_prompt": "x",
        "success_criteria": [CRITERION],
        "sandbox": {"python": None},
    }
    experiment = {"driver": "docker", "sandbox": {"docker": {"image": "debian:bookworm-slim"}}}

    resolved = resolve(trial_layers(task_layer, experiment))

    assert resolved.config["sandbox"]["driver"] == "docker"
    assert resolved.lineage["sandbox.docker.image"] == "experiment"
    with pytest.raises(
        ResolveError, match=r"sandbox.driver: driver: docker needs docker.image .*\(set by experiment\)"
    ):
        resolve(trial_layers(task_layer, {"driver": "docker"}))


def test_it_checks_docker_overrides_field_by_field():
    assert parse_overrides(["sandbox.docker.image=debian:bookworm-slim"]) == {
        "sandbox": {"docker": {"image": "debian:bookworm-slim"}}
    }
    assert parse_overrides(["sandbox.docker.env.LANG=C"]) == {"sandbox": {"docker": {"env": {"LANG": "C"}}}}
    with pytest.raises(OverrideError, match="extra_mounts .* is refused"):
        parse_overrides(["sandbox.docker.extra_mounts=[/etc:/etc]"])
    with pytest.raises(OverrideError, match="unknown field 'imag'; did you mean 'image'"):
        parse_overrides(["sandbox.docker.imag=x"])


# --- loading: lines, paths, the bundle ------------------------------------------------------------


def test_it_bundles_the_build_context_beside_the_task(tmp_path):
    docker_task(tmp_path / "boxed")

    result = load_tasks([tmp_path])

    assert result.ok, [str(e) for e in result.errors]
    files = read_bundle(result.tasks[0].bundle.blob)
    assert sorted(files) == ["environment/Dockerfile", "environment/data.txt", "task.yaml"]
    assert build_context("environment/Dockerfile") == "environment" and build_context("Dockerfile") == "."


@pytest.mark.parametrize(
    ("docker", "line", "field", "says"),
    [
        (
            "env_passthrough: [HOME]",
            7,
            "sandbox.docker.env_passthrough",
            "is refused: no variable of the worker",
        ),
        ("extra_mounts: ['/srv:/srv']", 7, "sandbox.docker.extra_mounts", "is refused: a trial sees only"),
        ("image: debian:bookworm-slim\nnetwork: bridge", 8, "sandbox.docker.network", "open internet"),
        (
            "dockerfile_path: environment/Dockerfile\nbuild: {extra_args: [--network=host]}",
            8,
            "sandbox.docker.build.extra_args",
            "'--network' is refused",
        ),
        (
            "dockerfile_path: nowhere/Dockerfile",
            7,
            "sandbox.docker.dockerfile_path",
            "file 'nowhere/Dockerfile' not found",
        ),
        (
            "dockerfile_path: ../../Dockerfile",
            7,
            "sandbox.docker.dockerfile_path",
            "leaves the folder being imported",
        ),
        ("dockerfile_path: environment", 7, "sandbox.docker.dockerfile_path", "expected a file"),
    ],
)
def test_it_names_the_file_line_and_field_of_each_docker_problem(tmp_path, docker, line, field, says):
    docker_task(tmp_path / "boxed", docker=docker)

    error = only_error(load_tasks([tmp_path / "boxed"]))

    assert error.startswith(f"{tmp_path / 'boxed' / 'task.yaml'}:{line}: {field}: "), error
    assert says in error


def test_it_refuses_a_build_context_holding_what_the_agent_may_not_see(tmp_path):
    write(tmp_path / "beside" / "Dockerfile", "FROM debian:bookworm-slim\nCOPY . /app\n")
    docker_task(tmp_path / "beside", docker="dockerfile_path: Dockerfile")
    docker_task(tmp_path / "ref", extra="reference: environment/solution")
    write(tmp_path / "ref" / "environment" / "solution" / "answer.txt", "42\n")

    errors = [str(e) for e in load_tasks([tmp_path]).errors]

    assert len(errors) == 2, errors
    assert "beside/task.yaml:7: sandbox.docker.dockerfile_path: the build context" in errors[0]
    assert "holds this YAML file: a COPY would put it in the agent's image" in errors[0]
    assert (
        "ref/task.yaml:7: sandbox.docker.dockerfile_path:" in errors[1]
        and "the reference solution" in errors[1]
    )


def test_it_refuses_a_symlink_in_the_build_context(tmp_path):
    docker_task(tmp_path / "boxed")
    os.symlink("data.txt", tmp_path / "boxed" / "environment" / "link.txt")

    error = only_error(load_tasks([tmp_path]))

    assert (
        "sandbox.docker.dockerfile_path:" in error and "link.txt is a symlink in the build context" in error
    )


def test_it_reads_no_yaml_of_a_build_context_or_a_verifiers_tests_as_a_task(tmp_path):
    docker_task(
        tmp_path / "boxed",
        extra="  - type: verifier\n    tests_dir: checks\n    script: run.sh",
    )
    write(tmp_path / "boxed" / "environment" / "compose.yaml", "services: {main: {build: .}}\n")
    write(tmp_path / "boxed" / "checks" / "run.sh", "#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n")
    write(tmp_path / "boxed" / "checks" / "cases.yaml", "- [not, a, task\n")

    result = load_tasks([tmp_path])

    assert result.ok, [str(e) for e in result.errors]
    assert [t.task_id for t in result.tasks] == ["boxed"]
    assert "checks/run.sh" in result.tasks[0].files and "checks/cases.yaml" in result.tasks[0].files


def test_it_names_a_missing_verifier_or_oracle_script(tmp_path):
    docker_task(
        tmp_path / "boxed",
        extra="  - type: verifier\nreference: {directory: solution, script: solve.sh}",
    )
    write(tmp_path / "boxed" / "tests" / "other.sh", "#!/bin/sh\n")
    write(tmp_path / "boxed" / "solution" / "README", "no script\n")

    errors = sorted(str(e) for e in load_tasks([tmp_path]).errors)

    assert len(errors) == 2, errors
    assert "boxed/task.yaml:11: success_criteria[1].script: file not found:" in errors[0]
    assert errors[0].endswith("boxed/tests/test.sh")
    assert "boxed/task.yaml:12: reference.script: file not found:" in errors[1]


def test_it_keys_an_image_by_its_context_and_build_settings():
    context = {"Dockerfile": b"FROM debian:bookworm-slim\n", "data.txt": b"42\n"}
    key = image_key(context, "Dockerfile", {})

    assert key == image_key(dict(reversed(context.items())), "Dockerfile", {"secrets": ["id=a,env=A"]})
    assert key != image_key({**context, "data.txt": b"43\n"}, "Dockerfile", {})
    assert key != image_key(context, "Dockerfile", {"args": {"V": "2"}})
    assert key != image_key(context, "Dockerfile", {"extra_args": ["--target", "x"]})
