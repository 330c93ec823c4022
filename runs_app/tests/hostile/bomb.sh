# A fork bomb with a depth guard: at most 2**(depth+1) - 1 shells even with no process limit.
# Shells block on a FIFO nobody writes to: `read` is a builtin, so waiting needs no new process
# and the main shell stays alive until the harness stops it.
mkfifo hold.fifo
bomb() {
    echo "$1" >> bomb.log
    if [ "$1" -lt "$2" ]; then
        bomb $(($1 + 1)) "$2" &
        bomb $(($1 + 1)) "$2" &
    fi
    read _ < hold.fifo
}
bomb 1 "${1:-8}" &
read _ < hold.fifo
