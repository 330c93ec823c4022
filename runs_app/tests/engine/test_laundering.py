"""A fail cannot be laundered into an error: whatever the agent leaves in its workspace (links,
link loops, FIFOs, sockets, huge files, odd names, deep JSON, deep folders) fails the criteria
that look at it, with a detail saying what was found, and never crashes the grader or the
snapshot, diff and artifact code the runner runs after the agent. Errors that are not the
content's stay errors. Each trick here is also planted through a real worker in
test_laundering_worker.py."""

from __future__ import annotations

import errno
import io
import json
import math
import os
import socket
import tarfile
from pathlib import Path

import pytest

from runs_app.engine.agents.command import CommandParser
from runs_app.engine.criteria import GradingContext, base, grade
from runs_app.engine.criteria.base import BoundedCallFailed, bounded
from runs_app.engine.sandbox.workspace import (
    cleanup,
    make_artifact_tarball,
    snapshot,
    tree_size,
    unified_diff,
)

BAD_NAME = os.fsdecode(b"caf\xe9-\xff.txt")  # Latin-1, not UTF-8
ODD_NAME = "line\nbreak\x1b[31m.txt"


def grade_one(workspace: Path, criterion: dict):
    result = grade([criterion], GradingContext(workspace=workspace))
    assert result.error is None, result.error
    json.dumps(result.criteria[0].details).encode("utf-8")  # storable as it is
    return result.criteria[0]


def assert_fails_saying(workspace: Path, criterion: dict, words: str) -> None:
    result = grade_one(workspace, criterion)
    assert (result.score, result.passed) == (0.0, False)
    assert words in json.dumps(result.details), result.details


def contains(path: str) -> dict:
    return {"type": "file_contains", "path": path, "includes": ["x"]}


def nested_folders(root: Path, depth: int) -> None:
    """Folders `a/a/a/...` `depth` deep with a file at the bottom, deeper than a path can name."""
    fd = os.open(root, os.O_RDONLY)
    for _ in range(depth):
        os.mkdir("a", dir_fd=fd)
        inner = os.open("a", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = inner
    os.close(os.open("bottom.txt", os.O_WRONLY | os.O_CREAT, dir_fd=fd))
    os.close(fd)


@pytest.fixture
def unix_socket(tmp_path):
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "out.txt"))
    yield
    sock.close()


# ---------------------------------------------------------------- the criteria


def test_a_symlink_loop_fails_the_check_naming_the_loop(tmp_path):
    (tmp_path / "out.txt").symlink_to("loop.txt")
    (tmp_path / "loop.txt").symlink_to("out.txt")

    assert_fails_saying(tmp_path, contains("out.txt"), "'out.txt' is a loop of symbolic links")
    assert_fails_saying(tmp_path, {"type": "file_exists", "path": "out.txt"}, "loop of symbolic links")
    assert_fails_saying(tmp_path, {"type": "file_exists", "path": "*.txt"}, '"match_count": 0')


def test_a_link_to_dev_zero_fails_the_check_naming_where_it_leads(tmp_path):
    (tmp_path / "out.txt").symlink_to("/dev/zero")

    assert_fails_saying(tmp_path, contains("out.txt"), "resolves outside its folder (to /dev/zero)")
    assert_fails_saying(tmp_path, {"type": "json_check", "path": "out.txt"}, "/dev/zero")


def test_a_fifo_in_place_of_the_checked_file_fails_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "out.txt")

    assert_fails_saying(tmp_path, contains("out.txt"), "'out.txt' is a FIFO (named pipe), not a regular file")
    assert_fails_saying(tmp_path, {"type": "file_exists", "path": "out.txt"}, "FIFO")
    assert_fails_saying(tmp_path, {"type": "file_exists", "path": "out.*"}, '"match_count": 0')


def test_a_socket_in_place_of_the_checked_file_fails(tmp_path, unix_socket):
    assert_fails_saying(tmp_path, contains("out.txt"), "'out.txt' is a socket, not a regular file")
    assert_fails_saying(
        tmp_path, {"type": "file_matches_regex", "path": "out.txt", "pattern": "x"}, "is a socket"
    )


def test_a_folder_in_place_of_the_checked_file_fails(tmp_path):
    (tmp_path / "out.txt").mkdir()

    assert_fails_saying(
        tmp_path, {"type": "json_check", "path": "out.txt"}, "is a folder, not a regular file"
    )


def test_a_huge_file_fails_the_check_naming_its_size(tmp_path):
    with open(tmp_path / "out.txt", "wb") as sparse:
        sparse.truncate(1 << 40)  # a terabyte that takes no disk

    assert_fails_saying(tmp_path, contains("out.txt"), f"'out.txt' is {1 << 40} bytes, over the")


def test_json_nested_100k_deep_fails_json_check(tmp_path):
    (tmp_path / "out.json").write_text("[" * 100_000 + "]" * 100_000)
    check = {
        "type": "json_check",
        "path": "out.json",
        "assertions": [{"expression": "length(@)", "expected": 1}],
    }

    assert_fails_saying(tmp_path, check, "'out.json' nests arrays or objects too deeply to parse")


def test_json_just_past_the_depth_limit_fails_and_at_it_is_checked_through(tmp_path):
    schema = {"type": "array", "items": {"anyOf": [{"$ref": "#"}, {"type": "integer"}]}}
    (tmp_path / "schema.json").write_text(json.dumps(schema))
    check = {
        "type": "json_check",
        "path": "out.json",
        "json_schema": "schema.json",
        "assertions": [{"expression": "[0][0]", "operator": "type", "expected": "array"}],
    }
    (tmp_path / "out.json").write_text("[" * 65 + "]" * 65)
    assert_fails_saying(tmp_path, check, "nests arrays or objects over 64 levels deep")

    (tmp_path / "out.json").write_text("[" * 64 + "]" * 64)
    assert grade_one(tmp_path, check).passed


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        ({"$ref": "#"}, "its $refs lead round in a circle"),
        ({"$ref": "#/nowhere"}, "a $ref leads nowhere"),
        ({"$ref": "https://example.com/schema.json"}, "a $ref leads nowhere"),
        ("[" * 100_000, "schema file 'schema.json' nests arrays or objects too deeply"),
    ],
)
def test_a_schema_file_the_agent_broke_fails_json_check(tmp_path, schema, words):
    (tmp_path / "out.json").write_text("{}")
    (tmp_path / "schema.json").write_text(schema if isinstance(schema, str) else json.dumps(schema))

    assert_fails_saying(
        tmp_path, {"type": "json_check", "path": "out.json", "json_schema": "schema.json"}, words
    )


def test_an_integer_too_long_to_read_is_invalid_json(tmp_path):
    (tmp_path / "out.json").write_text("1" * 5000)

    assert_fails_saying(
        tmp_path, {"type": "json_check", "path": "out.json"}, "is invalid JSON: Exceeds the limit"
    )


def test_a_search_that_does_not_finish_fails_the_pattern(tmp_path, monkeypatch):
    monkeypatch.setattr(base, "BOUNDED_SECONDS", 0.5)
    # `[a-z]+=` tries every start and backtracks over the whole run of letters: quadratic, hours at 16 MB.
    (tmp_path / "out.txt").write_text("a" * 300_000)
    (tmp_path / "out.json").write_text(json.dumps({"name": "a" * 300_000}))
    timed_out = "searching for '[a-z]+=' did not finish within 0.5 s"

    for must_match in (True, False):
        check = {
            "type": "file_matches_regex",
            "path": "out.txt",
            "pattern": "[a-z]+=",
            "must_match": must_match,
        }
        assert_fails_saying(tmp_path, check, timed_out)
    check = {"type": "file_check", "path": "out.txt", "patterns": [{"pattern": "[a-z]+="}, {"pattern": "a"}]}
    assert grade_one(tmp_path, check).score == 0.5
    regex = {"expression": "name", "operator": "regex", "expected": "[a-z]+="}
    assert_fails_saying(
        tmp_path, {"type": "json_check", "path": "out.json", "assertions": [regex]}, timed_out
    )


def test_a_file_name_that_is_not_utf8_is_shown_escaped(tmp_path):
    (tmp_path / BAD_NAME).write_text("x")
    (tmp_path / ODD_NAME).write_text("x")

    result = grade_one(tmp_path, {"type": "file_exists", "path": "*.txt"})

    assert result.passed
    assert result.details["matches"] == ["caf\\xe9-\\xff.txt", "line\\nbreak\\x1b[31m.txt"]


def test_a_surrogate_in_the_agents_json_is_stored_escaped(tmp_path):
    (tmp_path / "out.json").write_text('{"name": "\\udcff"}')
    check = {
        "type": "json_check",
        "path": "out.json",
        "assertions": [{"expression": "name", "expected": "x"}],
    }

    result = grade_one(tmp_path, check)

    assert not result.passed and "udcff" in result.details["assertions"][0]["actual"]


def test_an_unreadable_mode_fails_but_a_failing_disk_stays_an_error(tmp_path, monkeypatch):
    (tmp_path / "out.txt").write_text("x")
    real_open = os.open

    def failing(code):
        def open_(path, *args, **kwargs):
            if str(path).endswith("out.txt"):
                raise OSError(code, os.strerror(code), str(path))
            return real_open(path, *args, **kwargs)

        return open_

    monkeypatch.setattr(os, "open", failing(errno.EACCES))  # chmod 000 by the agent, on a non-root worker
    assert_fails_saying(tmp_path, contains("out.txt"), "'out.txt' cannot be read (permission denied)")

    monkeypatch.setattr(os, "open", failing(errno.EIO))  # the worker's disk: not the agent's doing
    result = grade([contains("out.txt")], GradingContext(workspace=tmp_path))
    assert result.error and "Input/output error" in result.error


def test_a_crash_of_a_bounded_call_is_an_error_not_a_fail():
    with pytest.raises(BoundedCallFailed, match="ZeroDivisionError"):
        bounded(lambda: 1 / 0)
    assert bounded(lambda: {"a": [1]}) == ({"a": [1]}, None)


def test_deeply_nested_tool_input_fails_command_executed_quietly(tmp_path):
    deep: dict = {}
    for _ in range(5000):
        deep = {"a": deep}
    calls = [{"name": "Write", "input": deep}]
    check = {"type": "command_executed", "command_pattern": "rm -rf"}

    result = grade([check], GradingContext(workspace=tmp_path, tool_calls=calls))

    assert result.error is None and not result.passed


# ---------------------------------------------------------------- snapshot, diff and artifact


@pytest.fixture
def hostile_workspace(tmp_path):
    """Every trick at once, beside an honest file."""
    trial = tmp_path / "trial"
    workspace = trial / "workspace"
    workspace.mkdir(parents=True)
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(workspace / "out.txt"))
    plant_tricks(workspace)
    yield workspace
    sock.close()
    cleanup(trial)  # pytest's own clean-up recurses, and the tree is deeper than it goes


def plant_tricks(tmp_path: Path) -> None:
    (tmp_path / "honest.py").write_text("print('hi')\n")
    (tmp_path / BAD_NAME).write_text("bad name\n")
    (tmp_path / ODD_NAME).write_text("odd name\n")
    (tmp_path / "link-to-bad").symlink_to(os.fsdecode(b"\xff-target"))
    (tmp_path / "loop").symlink_to("loop")
    (tmp_path / "zero").symlink_to("/dev/zero")
    os.mkfifo(tmp_path / "pipe")
    with open(tmp_path / "sparse.bin", "wb") as sparse:
        sparse.truncate(1 << 40)
    (tmp_path / "text.txt").write_text("t" * 400_000)
    links = tmp_path / "links"
    links.mkdir()
    for number in range(300):  # 120 MB to read, on 400 kB of disk
        os.link(tmp_path / "text.txt", links / f"{number}.txt")
    nested_folders(tmp_path, 3000)


def test_snapshot_diff_and_artifact_take_any_workspace(hostile_workspace):
    files = snapshot(hostile_workspace)

    assert files["honest.py"] == b"print('hi')\n"
    assert files[BAD_NAME] == b"bad name\n"
    assert files["link-to-bad"] == b"\xff-target" and files["loop"] == b"loop"
    assert files["sparse.bin"] is None and "pipe" not in files and "out.txt" not in files
    assert files["links/299.txt"] is files["text.txt"]  # read once for all its hard links
    assert snapshot(hostile_workspace, max_total_bytes=1000)["text.txt"] is None

    diff, _ = unified_diff({}, files, cap_bytes=1 << 20)
    diff.encode("utf-8")
    assert "diff --git a/caf\\xe9-\\xff.txt b/caf\\xe9-\\xff.txt\n" in diff
    assert "+++ b/line\\nbreak\\x1b[31m.txt\n" in diff

    data = make_artifact_tarball(hostile_workspace, max_bytes=1 << 30)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        names = tar.getnames()
        assert f"workspace/{BAD_NAME}" in names and f"workspace/{ODD_NAME}" in names
        assert tar.extractfile(f"workspace/{BAD_NAME}").read() == b"bad name\n"
        assert tar.getmember("workspace/loop").issym()
    assert not {"workspace/sparse.bin", "workspace/pipe", "workspace/out.txt"} & set(names)
    assert tree_size(hostile_workspace) < 2 << 20


def test_snapshot_and_artifact_stop_at_their_caps(tmp_path):
    for number in range(50):
        (tmp_path / f"{number:02}.txt").write_text("x" * 1000)

    assert len(snapshot(tmp_path, max_entries=10)) == 10
    assert sum(1 for content in snapshot(tmp_path, max_total_bytes=5000).values() if content) == 5
    for caps, kept in (({"max_entries": 10}, 10), ({"max_bytes": 5000}, 5)):
        data = make_artifact_tarball(tmp_path, **caps)
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            assert len(tar.getnames()) == 1 + kept  # and the workspace folder


def test_a_tree_deeper_than_python_walks_is_cleaned_up(tmp_path):
    root = tmp_path / "trial"
    (root / "workspace").mkdir(parents=True)
    nested_folders(root / "workspace", 3000)
    (root / "workspace" / "locked").mkdir()
    os.chmod(root / "workspace" / "locked", 0)

    cleanup(root)

    assert not root.exists()


# ---------------------------------------------------------------- a command agent's usage


def test_a_command_agents_impossible_usage_is_ignored():
    parser = CommandParser()
    lines = [
        {"type": "usage", "input_tokens": 10, "output_tokens": 5, "cost_usd": 0.5},
        {"type": "usage", "input_tokens": -1000, "output_tokens": 1e300, "cost_usd": -5},
        {"type": "usage", "input_tokens": 10**30, "cache_read_tokens": "7", "cost_usd": 10**400},
        {"type": "usage", "turns": -3, "cost_usd": True},
    ]
    for line in lines:
        parser.feed_line(json.dumps(line))
    for special in ("NaN", "Infinity", "-Infinity"):
        parser.feed_line(f'{{"type": "usage", "input_tokens": {special}, "cost_usd": {special}}}')

    usage = parser.usage
    assert (usage.input_tokens, usage.output_tokens, usage.cache_read_tokens) == (10, 5, 7)
    assert usage.turns == 6  # one a line, unless it says otherwise; -3 counts as none
    assert usage.cost_usd == 0.5 and math.isfinite(usage.cost_usd)
