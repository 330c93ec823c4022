"""A `command` agent that solves one task of test_laundering_worker's suite and fails the others.

With --plant it does the same work, then plants, in its workspace, every trick that once turned
a failed trial into an infrastructure error (which the pass rate leaves out): at the paths the
criteria of its failing tasks check, and everywhere for the snapshot, diff and artifact code.
"""

import json
import os
import socket
import sys

TASK = os.environ["EVALSITE_TASK_ID"]


def answer() -> None:
    if TASK == "exists":
        write("out.txt", "done\n")  # the one task it solves
    elif TASK == "loop":
        write("answer.txt", "41\n")  # 42 is right
    elif TASK == "json":
        write("result.json", json.dumps({"value": 2}))  # 1 is right
    elif TASK == "command":
        write("solution.py", "print('nope')\n")  # should print ok


def plant_where_checked() -> None:
    if TASK == "loop":
        os.remove("answer.txt")
        os.symlink("answer.txt", "answer.txt")
    elif TASK == "json":
        write("result.json", "[" * 100_000 + "]" * 100_000)
    elif TASK == "special":
        os.mkfifo("report.txt")
        socket.socket(socket.AF_UNIX).bind("sock.txt")
    elif TASK == "outside":
        os.symlink("/dev/zero", "data.txt")
        sparse("big.txt", 17 << 20)  # over what a criterion reads
    elif TASK == "command":
        # The grader runs this: it prints bytes that are not text, then crashes.
        write(
            "solution.py",
            "import os, sys\nsys.stdout.buffer.write(b'\\x00\\xff\\xfe not text\\n' * 1000)\n"
            "sys.stdout.flush()\nos.kill(os.getpid(), 11)\n",
        )


def plant_everywhere() -> None:
    os.mkdir("tricks")
    os.chdir("tricks")
    write(os.fsdecode(b"caf\xe9-\xff.txt"), "not a UTF-8 name\n")
    write("line\nbreak\x1b[31m.txt", "a name with a newline\n")
    os.symlink(os.fsdecode(b"\xff-nowhere"), "link-to-a-bad-name")
    os.symlink("loop", "loop")
    os.symlink("/dev/zero", "zero")
    os.mkfifo("pipe")
    socket.socket(socket.AF_UNIX).bind("socket")
    sparse("sparse.bin", 900 << 20)
    write("text.txt", "t" * 400_000 + "\n")
    os.mkdir("links")
    for number in range(300):  # 120 MB to read, on 400 kB of disk
        os.link("text.txt", f"links/{number}.txt")
    folder = os.open(".", os.O_RDONLY)
    for _ in range(3000):  # deeper than a path can name, and than Python's recursion
        os.mkdir("a", dir_fd=folder)
        inner = os.open("a", os.O_RDONLY, dir_fd=folder)
        os.close(folder)
        folder = inner
    os.close(os.open("bottom.txt", os.O_WRONLY | os.O_CREAT, dir_fd=folder))


def write(path: str, text: str) -> None:
    with open(path, "w") as handle:
        handle.write(text)


def sparse(path: str, size: int) -> None:
    with open(path, "wb") as handle:
        handle.truncate(size)


answer()
if "--plant" in sys.argv:
    plant_where_checked()
    plant_everywhere()
print(json.dumps({"type": "message", "text": f"{TASK}: done"}))
