#!/usr/bin/env bash
# `make containers`: the container engine container tasks run under, and the images they start
# from, made offline. Prints one line per step; every command's output goes to var/log/.
#
#   scripts/containers.sh               the engine, then the images (waits for them: make test)
#   scripts/containers.sh --background  the engine, then the images in the background (make run)
#   scripts/containers.sh --images      the images only (what --background runs)
#
# 1. Debian's docker.io, installed where root and apt-get can (quick when it is there).
# 2. dockerd, started in the background unless one answers already; waits until `docker info` does.
# 3. Each image only when missing (the daemon keeps them): evalsite/busybox (busybox-static),
#    evalsite/debian:<codename> (debootstrap --variant=minbase, 30-105 s), tagged debian:<codename>-slim,
#    and evalsite/python:<version> (Debian's python3 from .debs downloaded on this host), tagged
#    python:<version>-slim-<codename> and python:<version>-slim, so unmodified task Dockerfiles build.
#
# Exit status: 1 when the engine or an image could have been made here (root with apt-get) and was
# not, so CI fails loudly; elsewhere it says why this host has no containers and exits 0 (its workers
# take no container trials, and the container tests are skipped).
set -uo pipefail
cd "$(dirname "$0")/.."

# Debian's client, never the first `docker` on PATH: a preinstalled /usr/local/bin/docker may lack
# the buildx plugin that BuildKit builds need.
DOCKER="${EVALSITE_DOCKER:-/usr/bin/docker}"
DOCKERD=/usr/sbin/dockerd
LOG_DIR="$PWD/var/log"
LOG="$LOG_DIR/containers.log"
WORK="$PWD/var/containers"
LABEL=org.evalsite.image
# The Debian packages of the python image: Debian's python3 and what a python:*-slim image offers.
PYTHON_PACKAGES="python3 python3-venv python3-pip python-is-python3"
mkdir -p "$LOG_DIR" "$WORK"
export DEBIAN_FRONTEND=noninteractive

say() { echo "containers: $*"; echo "$(date -Is) $*" >>"$LOG"; }
run() { echo "$(date -Is) \$ $*" >>"$LOG"; "$@" >>"$LOG" 2>&1; }
now() { date +%s.%N; }
since() { awk -v from="$1" -v to="$(now)" 'BEGIN { printf "%.1f s", to - from }'; }
can_apt() { [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; }

# Where containers should work, not making them is an error; elsewhere only a notice.
give_up() {
  if can_apt; then
    say "FAILED: $* (see $LOG and $LOG_DIR/dockerd.log)"
    exit 1
  fi
  say "$*: container trials are not run by this host's workers, and the container tests are skipped"
  exit 0
}

apt_install() {
  run apt-get install -y -q --no-install-recommends "$@" ||
    { run apt-get update -q && run apt-get install -y -q --no-install-recommends "$@"; }
}

# --- 1. the engine ---------------------------------------------------------------------------

engine_answers() { "$DOCKER" info >/dev/null 2>&1; }

install_engine() {
  if [ -x "$DOCKER" ] && { [ -x "$DOCKERD" ] || engine_answers; }; then
    say "engine: $DOCKER ($(dpkg-query -W -f '${Version}' docker.io 2>/dev/null || echo 'not Debian'\''s docker.io')) installed"
    return
  fi
  can_apt || give_up "Debian's docker.io is not installed and cannot be here (it needs root and apt-get)"
  local started
  started=$(now)
  apt_install docker.io || give_up "apt-get install docker.io failed"
  say "installed Debian's docker.io ($(dpkg-query -W -f '${Version}' docker.io)) in $(since "$started")"
}

# Debian's docker-registry: the tests share built images through one on loopback, as container
# hosts do through EVALSITE_IMAGE_REGISTRY. Not started here (a test starts its own).
install_registry() {
  if [ -x /usr/bin/docker-registry ]; then
    return
  fi
  can_apt || { say "docker-registry is not installed and cannot be here: the registry test will fail"; return; }
  apt_install docker-registry || give_up "apt-get install docker-registry failed"
  say "installed Debian's docker-registry ($(dpkg-query -W -f '${Version}' docker-registry))"
}

start_engine() {
  local pidfile=/var/run/docker.pid started pid
  if engine_answers; then
    say "dockerd $("$DOCKER" version --format '{{.Server.Version}}' 2>/dev/null) already answers (pid $(cat "$pidfile" 2>/dev/null || echo '?')): reused"
    return
  fi
  [ "$(id -u)" = 0 ] || give_up "dockerd does not answer and only root can start it"
  # A pid file left by a killed daemon whose pid now names another process stops dockerd.
  pid=$(cat "$pidfile" 2>/dev/null || true)
  if [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" != dockerd ]; then
    rm -f "$pidfile"
  fi
  started=$(now)
  # Its own session: Ctrl-C on `make run` leaves it running, as a service would.
  echo "$(date -Is) starting $DOCKERD" >>"$LOG_DIR/dockerd.log"
  setsid -f "$DOCKERD" >>"$LOG_DIR/dockerd.log" 2>&1 </dev/null
  for _ in $(seq 300); do
    engine_answers && break
    sleep 0.2
  done
  engine_answers || { tail -n 20 "$LOG_DIR/dockerd.log" >&2; give_up "dockerd did not answer within 60 s"; }
  say "started dockerd $("$DOCKER" version --format '{{.Server.Version}}') (pid $(cat "$pidfile"), log $LOG_DIR/dockerd.log) in $(since "$started")"
}

# --- 3. the images -----------------------------------------------------------------------------

has_image() { "$DOCKER" image inspect "$1" >/dev/null 2>&1; }

# A public name (debian:bookworm-slim) on our image, unless the name holds an image not ours (a
# host with a registry keeps the real one).
tag_public() {
  local ours=$1 name=$2 label
  if [ "$("$DOCKER" image inspect -f '{{.Id}}' "$name" 2>/dev/null)" = "$("$DOCKER" image inspect -f '{{.Id}}' "$ours")" ]; then
    return
  fi
  if has_image "$name"; then
    label=$("$DOCKER" image inspect --format "{{index .Config.Labels \"$LABEL\"}}" "$name" 2>/dev/null)
    if [ -z "$label" ] || [ "$label" = "<no value>" ]; then
      say "image $name exists and is not made here: left as it is"
      return
    fi
  fi
  run "$DOCKER" tag "$ours" "$name" && say "image $name: tagged on $ours"
}

# `apt-get download` into the current folder, refreshing the package lists once if need be.
download() {
  run apt-get download "$@" || { can_apt && run apt-get update -q && run apt-get download "$@"; }
}

busybox_image() {
  local image=evalsite/busybox started dir root applet
  if has_image "$image"; then
    say "image $image: present"
    return
  fi
  started=$(now)
  dir=$(mktemp -d "$WORK/busybox.XXXXXX")
  (cd "$dir" && download busybox-static) || { rm -rf "$dir"; give_up "cannot download Debian's busybox-static"; }
  run dpkg-deb -x "$dir"/busybox-static_*.deb "$dir/package"
  root="$dir/root"
  mkdir -p "$root"/{bin,etc,root,tmp,proc,sys,dev,usr,var/tmp}
  cp "$dir/package/bin/busybox" "$root/bin/busybox"
  for applet in $("$root/bin/busybox" --list); do
    [ "$applet" = busybox ] || ln -s busybox "$root/bin/$applet"
  done
  ln -s bin "$root/sbin"
  ln -s ../bin "$root/usr/bin"
  ln -s ../bin "$root/usr/sbin"
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$root/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
  chmod 1777 "$root/tmp" "$root/var/tmp"
  tar --numeric-owner --owner=0 --group=0 -C "$root" -c . |
    run "$DOCKER" import --change 'CMD ["sh"]' --change "LABEL $LABEL=busybox" - "$image"
  local status=$?
  rm -rf "$dir"
  [ $status = 0 ] || give_up "docker import of $image failed"
  say "image $image: made from Debian's busybox-static in $(since "$started")"
}

# The mirror and suite apt already uses on this host (deb822 sources, or sources.list).
apt_mirror() {
  local uri
  uri=$(grep -h -m1 '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' | head -n1)
  [ -n "$uri" ] || uri=$(grep -h -m1 '^deb ' /etc/apt/sources.list 2>/dev/null | awk '{print $2}' | head -n1)
  echo "${uri:-http://deb.debian.org/debian}"
}

debian_image() {
  local codename=$1 image="evalsite/debian:$1" started dir
  if has_image "$image"; then
    say "image $image: present"
  else
    [ "$(id -u)" = 0 ] || give_up "debootstrap needs root: no $image (glibc base) here"
    if ! command -v debootstrap >/dev/null 2>&1; then
      can_apt || give_up "debootstrap is not installed: no $image (glibc base) here"
      apt_install debootstrap || give_up "apt-get install debootstrap failed"
    fi
    started=$(now)
    dir=$(mktemp -d "$WORK/rootfs.XXXXXX")
    if ! run debootstrap --variant=minbase "$codename" "$dir" "$(apt_mirror)"; then
      rm -rf "$dir"
      give_up "debootstrap --variant=minbase $codename failed"
    fi
    rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/* "$dir"/debootstrap
    tar --numeric-owner -C "$dir" -c . |
      run "$DOCKER" import --change 'CMD ["bash"]' --change "LABEL $LABEL=debian-$codename-minbase" - "$image"
    local status=$?
    rm -rf "$dir"
    [ $status = 0 ] || give_up "docker import of $image failed"
    say "image $image: made with debootstrap --variant=minbase $codename $(apt_mirror) in $(since "$started")"
  fi
  tag_public "$image" "debian:$codename-slim"
  tag_public "$image" "debian:$codename"
}

python_image() {
  local codename=$1 base="evalsite/debian:$1" version image started context packages status
  image=$("$DOCKER" image ls --filter "label=$LABEL=python-$codename" --format '{{.Repository}}:{{.Tag}}' |
    grep -m1 '^evalsite/python:')
  if [ -n "$image" ]; then
    say "image $image: present"
  else
    # The version Debian's python3 has here (3.11 on bookworm), as python images name it.
    version=$(apt-cache show --no-all-versions python3 2>/dev/null | awk -F'[ .]' '/^Version:/ { print $2 "." $3; exit }')
    [ -n "$version" ] || give_up "apt-cache knows no python3: no python image"
    image="evalsite/python:$version"
    started=$(now)
    context="$WORK/python-context"
    rm -rf "$context" && mkdir -p "$context/debs"
    # Only the packages the base lacks: apt resolves them against the base image's dpkg status
    # (a simulation, so every one is named, even those this host's apt cache holds).
    "$DOCKER" run --rm --network none "$base" cat /var/lib/dpkg/status >"$context/base.status" 2>>"$LOG" ||
      give_up "cannot read $base's package list"
    # shellcheck disable=SC2086
    packages=$(apt-get -o Dir::State::status="$context/base.status" install --simulate -qq \
      --no-install-recommends $PYTHON_PACKAGES 2>>"$LOG" | awk '/^Inst / { print $2 "=" substr($3, 2) }')
    [ -n "$packages" ] || give_up "apt-get cannot resolve $PYTHON_PACKAGES against $base"
    # shellcheck disable=SC2086
    (cd "$context/debs" && download $packages) || give_up "cannot download the python .debs"
    # apt orders the files' pre-dependencies (dpkg -i would not); pip installs into the system, as
    # in the python images (Debian's EXTERNALLY-MANAGED marker would refuse it).
    cat >"$context/Dockerfile" <<EOF
FROM $base
RUN --mount=type=bind,source=debs,target=/tmp/debs apt-get install -y -q --no-install-recommends /tmp/debs/*.deb \\
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /usr/lib/python3*/EXTERNALLY-MANAGED
CMD ["python3"]
EOF
    # Offline (no network in the build), with BuildKit for the bind mount (Debian's client has it).
    DOCKER_BUILDKIT=1 run "$DOCKER" build --network none --label "$LABEL=python-$codename" -t "$image" "$context"
    status=$?
    rm -rf "$context"
    [ $status = 0 ] || give_up "docker build of $image failed"
    say "image $image: Debian's python3 and $(echo "$packages" | wc -l) .debs on $base in $(since "$started")"
  fi
  version=${image#evalsite/python:}
  tag_public "$image" "python:$version-slim-$codename"
  tag_public "$image" "python:$version-slim"
}

images() {
  engine_answers || give_up "dockerd does not answer: no images made"
  local codename
  codename=$(. /etc/os-release 2>/dev/null && [ "${ID:-}" = debian ] && echo "${VERSION_CODENAME:-}")
  exec 9>"$WORK/images.lock"
  # One builder at a time (make run's background build, then make test).
  flock 9
  busybox_image
  if [ -z "$codename" ]; then
    give_up "this host is not Debian: no glibc base image (debootstrap follows the host's own release)"
  fi
  debian_image "$codename"
  python_image "$codename"
}

case "${1:-}" in
--images)
  images
  ;;
--background)
  install_engine
  start_engine
  setsid -f "$0" --images >/dev/null 2>>"$LOG" </dev/null
  say "images: made in the background when missing (log $LOG)"
  ;;
"")
  started=$(now)
  install_engine
  install_registry
  start_engine
  images
  say "done in $(since "$started")"
  ;;
*)
  echo "usage: $0 [--background | --images]" >&2
  exit 2
  ;;
esac
