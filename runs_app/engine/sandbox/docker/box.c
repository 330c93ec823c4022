/*
 * evalsite-box: the static program every trial's container gets at /.evalsite/box (static, so
 * that it runs in any image, with or without a C library).
 *
 * usage: evalsite-box init [ANYTHING...]
 *   PID 1 of the container. The container's life is the trial's: it idles until SIGTERM or
 *   SIGINT (then exits, and the kernel kills whatever else runs in the container) and reaps
 *   every process orphaned in it (a daemon an agent started, whose zombie would otherwise hold
 *   one of the container's pids). Its arguments (the image's CMD) are ignored.
 *
 * usage: evalsite-box run [-r RESOURCE:SOFT:HARD]... -- ARGV...
 *   What `docker exec` runs: set the command's resource limits ("inf" for RLIM_INFINITY), then
 *   exec ARGV. The host's launcher (`launcher/evalsite-launch.c`) cannot serve: its parent-death
 *   signal would fire when `runc exec`, the parent here, exits at once. Any failure exits 126
 *   before ARGV runs, with the reason on stderr.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

static void fail(const char *what) {
    fprintf(stderr, "evalsite-box: %s: %s\n", what, strerror(errno));
    _exit(126);
}

static void usage(const char *why) {
    fprintf(stderr, "evalsite-box: %s\n", why);
    _exit(126);
}

static rlim_t limit(const char *text) {
    if (strcmp(text, "inf") == 0) return RLIM_INFINITY;
    char *end;
    errno = 0;
    unsigned long long value = strtoull(text, &end, 10);
    if (errno || end == text || *end) usage("bad limit");
    return (rlim_t)value;
}

static int idle(void) {
    sigset_t wanted;
    sigemptyset(&wanted);
    sigaddset(&wanted, SIGCHLD);
    sigaddset(&wanted, SIGTERM);
    sigaddset(&wanted, SIGINT);
    sigprocmask(SIG_BLOCK, &wanted, NULL);
    for (;;) {
        int received = sigwaitinfo(&wanted, NULL);
        if (received == SIGTERM || received == SIGINT) return 0;
        while (waitpid(-1, NULL, WNOHANG) > 0) {
        }
    }
}

static int run(int argc, char **argv) {
    int i;
    for (i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0) { i++; break; }
        if (strcmp(argv[i], "-r") != 0 || i + 1 >= argc) usage("unknown option, or -r without its value");
        char resource[32], soft[32], hard[32];
        if (sscanf(argv[++i], "%31[0-9]:%31[0-9inf]:%31[0-9inf]", resource, soft, hard) != 3)
            usage("bad limit: RESOURCE:SOFT:HARD");
        struct rlimit value = {limit(soft), limit(hard)};
        if (setrlimit(atoi(resource), &value) != 0) fail("setrlimit");
    }
    if (i >= argc) usage("nothing to run after --");
    execvp(argv[i], argv + i);
    fail(argv[i]);
    return 126;
}

int main(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "init") == 0) return idle();
    if (argc >= 2 && strcmp(argv[1], "run") == 0) return run(argc, argv);
    usage("usage: evalsite-box init | run [-r RESOURCE:SOFT:HARD]... -- ARGV...");
    return 126;
}
