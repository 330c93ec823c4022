"""Harbor task folders as evalsite tasks: what maps to what, every refused key by name at its
line in task.toml, the folder's layout, and the bundle (the folder) as the task's version."""

import os
import shutil
import textwrap
from pathlib import Path

import pytest
from django.conf import settings

from experiments_app.specs.criteria import verifier_rewards
from experiments_app.specs.harbor import key_lines
from experiments_app.specs.loading import load_tasks

EXAMPLES = settings.BASE_DIR / "examples" / "harbor"
VALID = """\
version = "1.0"

[agent]
timeout_sec = 120.0

[verifier]
timeout_sec = 60.0

[environment]
allow_internet = false
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def harbor_folder(folder: Path, toml: str = VALID) -> Path:
    """A complete Harbor task folder with this task.toml."""
    write(folder / "task.toml", textwrap.dedent(toml))
    write(folder / "instruction.md", "Write hello.txt.\n")
    write(folder / "environment" / "Dockerfile", "FROM debian:bookworm-slim\nWORKDIR /app\n")
    write(folder / "tests" / "test.sh", "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    write(folder / "solution" / "solve.sh", "#!/bin/bash\necho hello > hello.txt\n")
    return folder


def errors_of(*paths: Path, **kwargs) -> list[str]:
    return [str(e) for e in load_tasks(list(paths), **kwargs).errors]


def only_error(*paths: Path) -> str:
    errors = errors_of(*paths)
    assert len(errors) == 1, errors
    return errors[0]


def spec_of(folder: Path) -> dict:
    result = load_tasks([folder])
    assert result.ok, [str(e) for e in result.errors]
    return result.tasks[0].spec.model_dump(mode="json", exclude_unset=True)


# --- what maps to what ----------------------------------------------------------------------------


def test_it_reads_a_harbor_folder_as_a_container_task_with_a_verifier():
    result = load_tasks([EXAMPLES / "hello-world"])

    assert result.ok, [str(e) for e in result.errors]
    (task,) = result.tasks
    assert task.task_id == "hello-world" and task.yaml_path_in_bundle == "task.toml"
    assert task.prompt.startswith("Create a file named `hello.txt`")
    assert task.source_yaml == (EXAMPLES / "hello-world" / "task.toml").read_text()
    assert sorted(task.files) == [
        "environment/Dockerfile",
        "instruction.md",
        "solution/solve.sh",
        "task.toml",
        "tests/test.sh",
    ]
    assert task.spec.model_dump(mode="json", exclude_unset=True) == {
        "task_id": "hello-world",
        "tags": ["trivial", "example", "category:file-operations", "difficulty:easy"],
        "initial_prompt_file": "instruction.md",
        "agent": {"working_directory_preamble": False},
        "run_limits": {"task_timeout": 120, "turn_timeout": 120},
        "sandbox": {
            "driver": "docker",
            "python": None,
            "docker": {
                "dockerfile_path": "environment/Dockerfile",
                "build_timeout": 300,
                "working_dir": "auto",
            },
            "limits": {"max_cpus": 1.0, "max_memory_mb": 512, "max_disk_mb": 1024},
            "network": "none",
        },
        "reference": {"directory": "solution", "script": "solve.sh"},
        "success_criteria": [
            {
                "type": "verifier",
                "description": "tests/test.sh (Harbor's verifier)",
                "tests_dir": "tests",
                "script": "test.sh",
                "timeout": 60,
            }
        ],
    }


def test_it_reads_the_task_table_and_applies_harbors_defaults():
    spec = spec_of(EXAMPLES / "shout-and-count")

    assert spec["description"] == "Two results from one verifier: a line count and an upper-cased copy"
    assert spec["tags"] == ["example", "text", "difficulty:easy"]
    assert spec["sandbox"]["limits"] == {"max_cpus": 1.0, "max_memory_mb": 512, "max_disk_mb": 10240}
    assert spec["run_limits"] == {"task_timeout": 300, "turn_timeout": 300}
    assert spec["agent"] == {"working_directory_preamble": False}  # Harbor sends the instruction bare


def test_it_maps_users_envs_image_workdir_sizes_and_listed_hosts(tmp_path):
    folder = harbor_folder(
        tmp_path / "mapped",
        """\
        [metadata]
        description = "from metadata"
        tags = ["File IO", "Python"]

        [agent]
        timeout_sec = 90.5
        user = "agent"

        [verifier]
        timeout_sec = 30
        user = "root"
        env = { STRICT = "1" }

        [solution]
        env = { MODE = "oracle" }

        [environment]
        docker_image = "registry.example.com/team/base:1.2"
        workdir = "/srv/work"
        memory = "2G"
        storage = "512M"
        cpus = 2
        network_mode = "allowlist"
        allowed_hosts = ["pypi.org", "files.pythonhosted.org"]
        env = { LANG = "C.UTF-8" }
        """,
    )

    spec = spec_of(folder)

    assert spec["description"] == "from metadata" and spec["tags"] == ["file-io", "python"]
    assert spec["run_limits"] == {"task_timeout": 91, "turn_timeout": 91}
    assert spec["sandbox"]["docker"] == {
        "image": "registry.example.com/team/base:1.2",  # wins over environment/Dockerfile, as in Harbor
        "working_dir": "/srv/work",
        "env": {"LANG": "C.UTF-8"},
        "user": "agent",
    }
    assert spec["sandbox"]["limits"] == {"max_cpus": 2.0, "max_memory_mb": 2048, "max_disk_mb": 512}
    assert (spec["sandbox"]["network"], spec["sandbox"]["allowed_hosts"]) == (
        "bridge",
        ["pypi.org", "files.pythonhosted.org"],
    )
    assert spec["reference"] == {"directory": "solution", "script": "solve.sh", "env": {"MODE": "oracle"}}
    verifier = spec["success_criteria"][0]
    assert (verifier["timeout"], verifier["user"], verifier["env"]) == (30, "root", {"STRICT": "1"})


def test_it_takes_an_image_instead_of_a_dockerfile_and_no_solution(tmp_path):
    folder = harbor_folder(
        tmp_path / "prebuilt",
        VALID.replace("allow_internet = false", 'allow_internet = false\ndocker_image = "x:1"'),
    )
    (folder / "environment" / "Dockerfile").unlink()
    shutil.rmtree(folder / "solution")

    spec = spec_of(folder)

    assert spec["sandbox"]["docker"]["image"] == "x:1" and "reference" not in spec


def test_it_makes_the_folder_the_tasks_version(tmp_path):
    first = load_tasks([EXAMPLES / "hello-world"]).tasks[0]
    copy = Path(shutil.copytree(EXAMPLES / "hello-world", tmp_path / "elsewhere" / "hello-world"))
    (copy / "README.md").write_text("notes\n")
    (copy / "README.md").unlink()
    (copy / "__pycache__").mkdir()
    (copy / "__pycache__" / "x.pyc").write_bytes(b"\0")

    assert load_tasks([copy]).tasks[0].bundle.digest == first.bundle.digest
    (copy / "tests" / "test.sh").write_text("#!/bin/bash\necho 0 > /logs/verifier/reward.txt\n")
    assert load_tasks([copy]).tasks[0].bundle.digest != first.bundle.digest


def test_it_finds_harbor_folders_beside_yaml_tasks_and_reads_nothing_inside_them_as_yaml(tmp_path):
    harbor_folder(tmp_path / "suite" / "harbor-one")
    write(tmp_path / "suite" / "harbor-one" / "tests" / "cases.yaml", "- [broken\n")
    write(tmp_path / "suite" / "harbor-one" / "environment" / "docker-compose.yml.bak", "x")
    write(
        tmp_path / "suite" / "yaml-one" / "task.yaml",
        "task_id: yaml-one\ninitial_prompt: x\nsuccess_criteria: [{type: file_exists, path: a}]\n",
    )

    result = load_tasks([tmp_path / "suite"])

    assert result.ok, [str(e) for e in result.errors]
    assert sorted(t.task_id for t in result.tasks) == ["harbor-one", "yaml-one"]


def test_it_takes_the_task_toml_file_as_its_folder(tmp_path):
    folder = harbor_folder(tmp_path / "by-file")

    assert [t.task_id for t in load_tasks([folder / "task.toml"]).tasks] == ["by-file"]


def test_it_refuses_a_yaml_task_and_a_harbor_folder_of_one_id(tmp_path):
    harbor_folder(tmp_path / "twice")
    write(
        tmp_path / "other" / "task.yaml",
        "task_id: twice\ninitial_prompt: x\nsuccess_criteria: [{type: file_exists, path: a}]\n",
    )

    (error,) = errors_of(tmp_path)

    assert error.startswith(f"{tmp_path}/twice/task.toml: duplicate task_id 'twice': also defined in ")
    assert error.endswith("other/task.yaml:1")


# --- refused by name, at the key's line -----------------------------------------------------------


@pytest.mark.parametrize(
    ("toml", "line", "field", "says"),
    [
        (
            "[environment]\nallow_internet = true\n",
            2,
            "environment.allow_internet",
            "gives the container open internet",
        ),
        ('[environment]\nnetwork_mode = "public"\n', 2, "environment.network_mode", "(open internet: "),
        ("[environment]\nallow_internet = false\ngpus = 1\n", 3, "environment.gpus", "(GPUs: "),
        ('[environment]\nallow_internet = false\ngpu_types = ["H100"]\n', 3, "environment.gpu_types", "GPU"),
        ("[environment]\nallow_internet = false\ntpus = 4\n", 3, "environment.tpus", "(TPUs"),
        (
            '[environment]\nallow_internet = false\nmcp_servers = [{ name = "x", url = "http://x" }]\n',
            3,
            "environment.mcp_servers",
            "(MCP servers",
        ),
        (
            '[environment]\nallow_internet = false\nskills_dir = "/skills"\n',
            3,
            "environment.skills_dir",
            "skills",
        ),
        (
            '[environment]\nallow_internet = false\n[environment.healthcheck]\ncommand = "true"\n',
            3,
            "environment.healthcheck",
            "(a readiness check",
        ),
        ('[environment]\nallow_internet = false\nos = "windows"\n', 3, "environment.os", "Windows container"),
        (
            '[environment]\nallow_internet = false\n[agent]\nnetwork_mode = "no-network"\n',
            4,
            "agent.network_mode",
            "one network",
        ),
        (
            '[environment]\nallow_internet = false\n[agent]\nallowed_hosts = ["x.org"]\n',
            4,
            "agent.allowed_hosts",
            "one network",
        ),
        (
            '[environment]\nallow_internet = false\n[verifier]\nnetwork_mode = "public"\n',
            4,
            "verifier.network_mode",
            "one network",
        ),
        (
            '[environment]\nallow_internet = false\n[verifier]\nallowed_hosts = ["x.org"]\n',
            4,
            "verifier.allowed_hosts",
            "one network",
        ),
        (
            '[environment]\nallow_internet = false\n[verifier]\nimport_path = "pkg.mod:Check"\n',
            4,
            "verifier.import_path",
            "(a verifier class Harbor runs on its own host",
        ),
        (
            '[environment]\nallow_internet = false\n[verifier]\nenvironment_mode = "separate"\n',
            4,
            "verifier.environment_mode",
            "(a separate verifier container",
        ),
        (
            'artifacts = ["/app/out"]\n[environment]\nallow_internet = false\n',
            1,
            "artifacts",
            "(paths Harbor copies",
        ),
        (
            'multi_step_reward_strategy = "mean"\n[environment]\nallow_internet = false\n',
            1,
            "multi_step_reward_strategy",
            "(multi-step tasks",
        ),
        ('[environment]\nallow_internet = false\n[[steps]]\nname = "one"\n', 3, "steps", "(multi-step tasks"),
        (
            '[environment]\nallow_internet = false\nenv = { TOKEN = "${TOKEN}" }\n',
            3,
            "environment.env.TOKEN",
            "from the host's environment",
        ),
        (
            '[environment]\nallow_internet = false\n[verifier]\nenv = { KEY = "${KEY:-x}" }\n',
            4,
            "verifier.env.KEY",
            "passes no variable of the worker",
        ),
        (
            '[environment]\nallow_internet = false\n[solution]\nenv = { KEY = "${KEY}" }\n',
            4,
            "solution.env.KEY",
            "write the value itself",
        ),
    ],
)
def test_it_refuses_what_it_cannot_run_as_harbor_does_by_name_at_its_line(tmp_path, toml, line, field, says):
    folder = harbor_folder(tmp_path / "refused", toml)

    error = only_error(folder)

    assert error.startswith(f"{folder}/task.toml:{line}: {field}: "), error
    assert says in error


def test_it_has_a_case_above_for_every_key_it_refuses():
    from experiments_app.specs.harbor import REFUSED

    (marker,) = test_it_refuses_what_it_cannot_run_as_harbor_does_by_name_at_its_line.pytestmark
    tested = {case[2] for case in marker.args[1]}

    assert {".".join(path) for path, _, _ in REFUSED} | {"environment.allow_internet"} <= tested


@pytest.mark.parametrize(
    ("toml", "line", "field", "says"),
    [
        ("[environment\ncpus = 1\n", 1, "", "invalid TOML: "),
        ("[environment]\nallow_internet = false\ncpu = 2\n", 3, "environment.cpu", "did you mean 'cpus'?"),
        ("[enviroment]\nallow_internet = false\n", 1, "enviroment", "did you mean 'environment'?"),
        ('[environment]\nallow_internet = false\ncpus = "two"\n', 3, "environment.cpus", "got 'two'"),
        (
            '[environment]\nallow_internet = false\nmemory = "lots"\n',
            3,
            "environment.memory",
            "is not a size",
        ),
        (
            '[environment]\nallow_internet = false\nworkdir = "/"\n',
            3,
            "environment.workdir",
            "keeps for itself",
        ),
        (
            '[environment]\nallow_internet = false\ndocker_image = "Bad Image"\n',
            3,
            "environment.docker_image",
            "is not a Docker image reference",
        ),
        (
            '[environment]\nnetwork_mode = "allowlist"\nallowed_hosts = ["localhost"]\n',
            3,
            "environment.allowed_hosts",
            "must be a public host name",
        ),
        (
            "[environment]\nallow_internet = false\n[agent]\ntimeout_sec = 10.0\n",
            4,
            "agent.timeout_sec",
            "greater than or equal to 30",
        ),
        (
            '[environment]\nallow_internet = false\n[agent]\nuser = "two words"\n',
            4,
            "agent.user",
            "user name or uid",
        ),
        (
            '[environment]\nallow_internet = false\n[verifier]\nenv = { EVALSITE_X = "1" }\n',
            4,
            "verifier.env",
            "set by the worker",
        ),
    ],
)
def test_it_names_the_line_and_key_of_each_problem_in_task_toml(tmp_path, toml, line, field, says):
    folder = harbor_folder(tmp_path / "broken", toml)

    error = only_error(folder)

    where = f"{folder}/task.toml:{line}: {field + ': ' if field else ''}"
    assert error.startswith(where), error
    assert says in error


def test_it_warns_of_unknown_keys_when_lenient(tmp_path):
    folder = harbor_folder(tmp_path / "lenient", VALID + 'colour = "blue"\ncpu = 2\n')

    result = load_tasks([folder], lenient=True)

    assert result.ok and [t.task_id for t in result.tasks] == ["lenient"]
    assert [str(w) for w in result.warnings] == [
        f"{folder}/task.toml:11: environment.colour: unknown key 'colour', kept but not used",
        f"{folder}/task.toml:12: environment.cpu: unknown key 'cpu', kept but not used; did you mean 'cpus'?",
    ]


# --- the folder's layout --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "names", "says"),
    [
        (
            lambda f: (f / "instruction.md").unlink(),
            "instruction.md",
            "not found: a Harbor task's prompt is instruction.md",
        ),
        (
            lambda f: (f / "tests" / "test.sh").unlink(),
            "tests/test.sh",
            "not found: a Harbor task's verifier is tests/test.sh",
        ),
        (
            lambda f: (f / "environment" / "Dockerfile").unlink(),
            "environment/Dockerfile",
            "not found: a Harbor task's container is built from environment/Dockerfile, or named by",
        ),
        (
            lambda f: write(f / "environment" / "docker-compose.yaml", "services: {}\n"),
            "environment/docker-compose.yaml",
            "a compose file asks for several containers",
        ),
        (lambda f: write(f / "steps" / "one" / "instruction.md", "x\n"), "steps", "multi-step tasks"),
        (
            lambda f: (f / "solution" / "solve.sh").rename(f / "solution" / "solve.py"),
            "solution/solve.sh",
            "not found: the oracle runs solution/solve.sh",
        ),
    ],
)
def test_it_names_a_missing_or_refused_file_of_the_folder(tmp_path, change, names, says):
    folder = harbor_folder(tmp_path / "layout")
    change(folder)

    error = only_error(folder)

    assert error.startswith(f"{folder}/{names}: "), error
    assert says in error


def test_it_takes_the_folders_name_as_the_id_and_says_so(tmp_path):
    folder = harbor_folder(tmp_path / "two words")

    assert only_error(folder) == (
        f"{folder}/task.toml: the folder's name 'two words' is the task's id, and must be letters, digits, "
        "'-', '_' and single inner dots (at most 200): rename the folder"
    )


def test_it_refuses_symlinks_leaving_the_folder_or_inside_the_build_context(tmp_path):
    outside = write(tmp_path / "secret.txt", "secret\n")
    escaping = harbor_folder(tmp_path / "root" / "escaping")
    os.symlink(outside, escaping / "tests" / "data.txt")
    linked = harbor_folder(tmp_path / "root" / "linked")
    os.symlink("../tests/test.sh", linked / "environment" / "test.sh")

    errors = errors_of(tmp_path / "root")

    assert len(errors) == 2, errors
    root = tmp_path / "root"
    assert errors[0] == (
        f"{root}/escaping/task.toml: {root}/escaping/tests/data.txt is a symlink leaving the imported folder"
    )
    assert errors[1].startswith(
        f"{root}/linked/task.toml: {root}/linked/environment/test.sh is a symlink in the build context"
    )


def test_it_refuses_a_folder_over_the_bundle_cap(tmp_path):
    folder = harbor_folder(tmp_path / "heavy")
    (folder / "environment" / "blob.bin").write_bytes(b"x" * 2048)

    (error,) = errors_of(folder, max_bundle_bytes=1024)

    assert error.startswith(f"{folder}/task.toml: bundle is ") and "environment/blob.bin" in error


# --- line finding and rewards ---------------------------------------------------------------------


def test_it_finds_the_line_of_each_toml_key():
    text = textwrap.dedent(
        '''\
        version = "1.0"  # a comment = 1
        notes = """
        fake = 2
        """
        [metadata]
        tags = [
          "a = b",
        ]
        "quoted key" = 1
        [verifier]
        env = { A = "x,y", "B" = 2, inner = { c = 1 } }
        [environment]
        environment.deep = 1
        [[steps]]
        name = "one"
        '''
    )

    lines = key_lines(text)

    assert lines == {
        ("version",): 1,
        ("notes",): 2,
        ("metadata",): 5,
        ("metadata", "tags"): 6,
        ("metadata", "quoted key"): 9,
        ("verifier",): 10,
        ("verifier", "env"): 11,
        ("verifier", "env", "A"): 11,
        ("verifier", "env", "B"): 11,
        ("verifier", "env", "inner"): 11,
        ("verifier", "env", "inner", "c"): 11,
        ("environment",): 12,
        ("environment", "environment", "deep"): 13,
        ("steps",): 14,
        ("steps", "name"): 15,
    }


@pytest.mark.parametrize(
    ("reward_json", "reward_txt", "rewards"),
    [
        (None, b"1\n", {"reward": 1.0}),
        (None, b" 0.25 ", {"reward": 0.25}),
        (b'{"count": 1, "upper": 0.5}', b"0", {"count": 1.0, "upper": 0.5}),  # reward.json wins
    ],
)
def test_it_reads_a_verifiers_rewards_as_harbor_does(reward_json, reward_txt, rewards):
    assert verifier_rewards(reward_json, reward_txt) == rewards


@pytest.mark.parametrize(
    ("reward_json", "reward_txt", "says"),
    [
        (None, None, "wrote neither"),
        (None, b"", "reward.txt is empty"),
        (None, b"pass", "must hold one number"),
        (None, b"2", "outside [0, 1]"),
        (None, b"nan", "must be a number"),
        (b"[1]", None, "must hold a JSON object"),
        (b"{}", None, "must hold a JSON object"),
        (b'{"ok": true}', None, "'ok' must be a number"),
        (b'{"ok": -0.5}', None, "outside [0, 1]"),
        (b"{", b"1", "reward.json is not JSON"),
    ],
)
def test_it_makes_a_bad_reward_file_an_error_never_a_score(reward_json, reward_txt, says):
    with pytest.raises(ValueError, match=r"" + says.replace("[", r"\[").replace("]", r"\]")):
        verifier_rewards(reward_json, reward_txt)


@pytest.mark.parametrize(
    ("environment", "network", "hosts"),
    [
        ("allow_internet = false", "none", None),
        ("", "none", None),  # Harbor's default is internet; evalsite's is none (docs/harbor.md)
        ('network_mode = "no-network"', "none", None),
        ('network_mode = "allowlist"', "none", None),  # an allowlist of no host reaches nothing
        ('allowed_hosts = ["pypi.org"]', "bridge", ["pypi.org"]),  # hosts alone are an allowlist
        ('allow_internet = true\nallowed_hosts = ["pypi.org"]', "bridge", ["pypi.org"]),
        ('allow_internet = true\nnetwork_mode = "no-network"', "none", None),  # the mode wins
    ],
)
def test_it_gives_a_harbor_task_no_network_unless_it_lists_hosts(tmp_path, environment, network, hosts):
    spec = spec_of(harbor_folder(tmp_path / "net", f"[environment]\n{environment}\n"))

    assert (spec["sandbox"]["network"], spec["sandbox"].get("allowed_hosts")) == (network, hosts)


def test_it_refuses_hosts_beside_another_network_mode_as_harbor_does(tmp_path):
    folder = harbor_folder(
        tmp_path / "net", '[environment]\nnetwork_mode = "no-network"\nallowed_hosts = ["pypi.org"]\n'
    )

    assert only_error(folder) == (
        f"{folder}/task.toml:3: environment.allowed_hosts: allowed_hosts needs "
        "network_mode = \"allowlist\", not 'no-network'"
    )
