# Tries to leave a trial's container, one attempt a line: "blocked NAME" when the attempt
# failed, "ESCAPED NAME: what it got" when it worked. Busybox sh is enough.
# usage: MARKER=... container_escape.sh HOST_PORT HOST_CANARY OTHER_WORKSPACE
# MARKER is on the command line of another trial's process (in the environment here, so that no
# process of this script carries it on its own command line).
port=$1 canary=$2 other=$3

attempt() {  # NAME, then a command whose success (exit 0) is an escape
    name=$1; shift
    if got=$("$@" 2>/dev/null); then echo "ESCAPED $name: $(echo "$got" | head -c 200)"; else echo "blocked $name"; fi
}
exists() { for p in "$@"; do [ -e "$p" ] && { echo "$p"; return 0; }; done; return 1; }
connect() { echo hello | nc -w 2 "$1" "$2"; }
write_to() { for p in "$@"; do echo x 2>/dev/null > "$p" && { echo "$p"; return 0; }; done; return 1; }
other_process() {  # another container's process, by the marker on its command line
    for f in /proc/[0-9]*/cmdline; do
        line=$(tr '\0' ' ' < "$f" 2>/dev/null)
        case "$line" in *"$MARKER"*) echo "$f: $line"; return 0 ;; esac
    done
    return 1
}

attempt engine-socket exists /var/run/docker.sock /run/docker.sock /run/containerd/containerd.sock \
    /var/run/docker/containerd/containerd.sock /run/docker-userns.sock
attempt bridge-host connect 172.17.0.1 "$port"
attempt host-loopback connect 127.0.0.1 "$port"
attempt host-file cat "$canary"
attempt shadow cat /etc/shadow
attempt write-system write_to /etc/escape /usr/escape /bin/escape /escape /var/tmp/escape /.evalsite/escape
attempt replace-box sh -c 'echo x > /.evalsite/box'
attempt other-workspace ls "$other"
attempt other-process other_process
attempt proc-sys write_to /proc/sys/vm/drop_caches /proc/sys/kernel/hostname /proc/sysrq-trigger
attempt sys-write write_to /sys/kernel/mm/transparent_hugepage/enabled /sys/fs/cgroup/pids/pids.max
attempt mount mount -t tmpfs escape /mnt
attempt unshare unshare -r -m true
attempt chroot-dev sh -c 'mknod /tmp/disk b 254 0 && cat /tmp/disk | head -c 16'
attempt route sh -c 'grep -v "^ *lo:" /proc/net/dev | grep ":"'
echo done
