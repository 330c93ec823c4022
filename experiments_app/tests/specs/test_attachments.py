"""The attachment rule: how a command variant names a file of its experiment."""

from experiments_app.specs.attachments import script_problems, suggested_command, unused_files


def test_it_suggests_the_usual_command_by_the_files_kind():
    assert suggested_command("agent.py") == "python3 {script}"
    assert suggested_command("run.SH") == "sh {script}"
    assert suggested_command("agent") == "sh {script}"
    assert suggested_command("agent.mjs") == "node {script}"


def test_a_script_its_command_runs_as_placeholder_is_fine():
    assert script_problems({"command": "python3 {script} --fast", "script": "agent.py"}, ["agent.py"]) == []
    assert script_problems({"command": ["python3", "{script}"], "script": "../agents/a.py"}, []) == []


def test_a_script_the_command_never_runs_is_a_problem_with_its_fix():
    [(option, message)] = script_problems({"command": "python3 agent.py", "script": "agent.py"}, ["agent.py"])

    assert option == "command"
    assert "never says {script}" in message and "e.g. python3 {script}" in message


def test_a_command_naming_an_experiment_file_as_if_in_the_workspace_is_a_problem():
    for command in ("python3 agent.py", "python3 ./agent.py < in", ["python3", "sub/agent.py"]):
        [(option, message)] = script_problems({"command": command}, ["agent.py", "notes.md"])
        assert option == "command"
        assert "agent.py is a file of the experiment, not of the task's workspace" in message
        assert "set the script to agent.py" in message


def test_a_command_naming_other_files_is_not_a_problem():
    assert script_problems({"command": "python3 solve.py"}, ["agent.py"]) == []
    assert script_problems({"command": "python3 my-agent.py"}, ["agent.py"]) == []
    assert script_problems({"command": "echo 'unbalanced"}, ["agent.py"]) == []
    assert script_problems({}, ["agent.py"]) == []


def test_an_attachment_is_unused_unless_a_path_names_it():
    assert unused_files(["agent.py", "prompt.md"], ["agent.py"]) == ["prompt.md"]
    assert unused_files(["agent.py"], ["../agents/agent.py"]) == []
    assert unused_files([], ["agent.py"]) == []
