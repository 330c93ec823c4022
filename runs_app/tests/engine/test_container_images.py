"""A task's image: built once per host and cached by its build context's digest; with a
registry (EVALSITE_IMAGE_REGISTRY), built once, pushed, and pulled by the other hosts."""

import hashlib
import socket
import subprocess
import time

import pytest

from runs_app.engine.sandbox.docker import command, images
from runs_app.tests.containers import require_engine

DOCKERFILE = "FROM evalsite/busybox\nRUN echo {marker} > /marker\n"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def registry(tmp_path):
    """Debian's docker-registry on loopback (the engine treats 127.0.0.0/8 as a plain-HTTP registry)."""
    require_engine()
    port = free_port()
    config = tmp_path / "registry.yml"
    config.write_text(
        f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {tmp_path / 'store'}\n"
        f"http:\n  addr: 127.0.0.1:{port}\n"
    )
    server = subprocess.Popen(
        ["/usr/bin/docker-registry", "serve", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.1)
    yield f"127.0.0.1:{port}"
    server.kill()
    server.wait()


def context(folder, marker):
    folder.mkdir()
    (folder / "Dockerfile").write_text(DOCKERFILE.format(marker=marker))
    return folder


def forget(reference: str) -> None:
    subprocess.run([command.docker_binary(), "rmi", "--force", reference], capture_output=True)


def test_an_image_is_built_once_then_found_and_another_host_pulls_it(tmp_path, registry):
    marker = tmp_path.name
    folder = context(tmp_path / "env", marker)
    key = images.image_key_for(folder, "Dockerfile", {})
    reference = f"{images.TASK_REPOSITORY}:{key}"
    forget(reference)
    forget(f"{registry}/{reference}")
    lines: list[str] = []
    try:
        locks = tmp_path / "locks"
        first = images.built_image(
            key, folder, "Dockerfile", {}, lock_dir=locks, log=lines.append, registry=registry
        )
        again = images.built_image(
            key, folder, "Dockerfile", {}, lock_dir=locks, log=lines.append, registry=registry
        )
        assert (first.built, again.built, again.pulled) == (True, False, False)
        assert first.digest == again.digest and first.digest.startswith("sha256:")
        assert any(line.startswith(f"pushed {registry}/") for line in lines)

        # Another host: it holds nothing of the image, and pulls what the first pushed.
        forget(reference)
        forget(f"{registry}/{reference}")
        elsewhere = images.built_image(key, folder, "Dockerfile", {}, lock_dir=tmp_path / "locks2",
                                       log=lines.append, registry=registry)  # fmt: skip
        assert (elsewhere.built, elsewhere.pulled) == (False, True)
        assert elsewhere.digest == first.digest
    finally:
        forget(reference)
        forget(f"{registry}/{reference}")


def test_a_changed_build_context_is_another_image(tmp_path):
    require_engine()
    one = context(tmp_path / "one", "a")
    two = context(tmp_path / "two", "b")
    assert images.image_key_for(one, "Dockerfile", {}) != images.image_key_for(two, "Dockerfile", {})
    assert images.image_key_for(one, "Dockerfile", {}) != images.image_key_for(
        one, "Dockerfile", {"args": {"X": "1"}}
    )
    assert images.image_key_for(one, "Dockerfile", {}) == images.image_key_for(one, "Dockerfile", {})


def test_a_build_secret_reaches_the_build_only_from_a_variable_the_worker_allows(tmp_path):
    require_engine()
    folder = tmp_path / "env"
    folder.mkdir()
    (folder / "Dockerfile").write_text(
        # The build checks the secret's digest, so that its own text names only the digest.
        "FROM evalsite/busybox\nRUN --mount=type=secret,id=tok "
        f'test "$(md5sum < /run/secrets/tok | cut -c1-32)" = {hashlib.md5(b"s3cr3t").hexdigest()}\n'
    )
    build = {"secrets": ["id=tok,env=BUILD_TOKEN"]}
    key = images.image_key_for(folder, "Dockerfile", build)
    with pytest.raises(images.ImageError, match="BUILD_TOKEN, which this worker does not hand to builds"):
        images.built_image(key, folder, "Dockerfile", build, lock_dir=tmp_path, log=print, secrets_env={})
    try:
        made = images.built_image(
            key,
            folder,
            "Dockerfile",
            build,
            lock_dir=tmp_path,
            log=print,
            secrets_env={"BUILD_TOKEN": "s3cr3t"},
        )
        assert made.built
        # The secret is in no layer of the image.
        history = subprocess.run(
            [command.docker_binary(), "history", "--no-trunc", made.reference], capture_output=True, text=True
        )
        assert "s3cr3t" not in history.stdout
    finally:
        forget(f"{images.TASK_REPOSITORY}:{key}")


def test_build_args_and_target_reach_docker_build_and_other_flags_never_do(tmp_path):
    args, env = images.build_args(
        "evalsite/task:k", tmp_path, "Dockerfile", {"args": {"A": "1"}, "extra_args": ["--target", "app"]}, {}
    )
    assert args[:5] == ["build", "--tag", "evalsite/task:k", "--file", str(tmp_path / "Dockerfile")]
    assert args[args.index("--build-arg") : args.index("--build-arg") + 2] == ["--build-arg", "A=1"]
    assert args[args.index("--target") : args.index("--target") + 2] == ["--target", "app"]
    assert args[args.index("--network") : args.index("--network") + 2] == ["--network", "none"]
    assert env["DOCKER_BUILDKIT"] == "0" and args[-1] == str(tmp_path)
