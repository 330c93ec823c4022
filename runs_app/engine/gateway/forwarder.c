/*
 * evalsite-forward: the model gateway's door inside a trial's sandbox. It listens on the
 * sandbox's own loopback, carries every connection to the gateway's unix socket (bound into the
 * sandbox), and runs the agent. A small program where a Python forwarder cost each agent start
 * an interpreter (about 25 ms of CPU) and about 10 MB for the trial's whole life.
 *
 * usage: evalsite-forward PORT SOCKET -- ARGV...
 * 1. listen on 127.0.0.1:PORT (before ARGV starts, so its first connection finds it);
 * 2. fork the accepter: stdio to /dev/null, every other descriptor closed; each connection gets
 *    a child that relays bytes both ways (a half-close is passed on) until both sides end;
 * 3. exec ARGV in this process. When it ends, the sandbox ends, and the accepter with it.
 * Any failure before ARGV runs exits 126 with the reason on stderr.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static void fail(const char *what) {
    fprintf(stderr, "evalsite-forward: %s: %s\n", what, strerror(errno));
    _exit(126);
}

static int write_all(int fd, const char *data, ssize_t size) {
    while (size > 0) {
        ssize_t sent = write(fd, data, (size_t)size);
        if (sent < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        data += sent;
        size -= sent;
    }
    return 0;
}

/* Bytes both ways between the sandbox's connection and the gateway, until both have ended. */
static void relay(int conn, const char *path) {
    int up = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    if (up < 0 || strlen(path) >= sizeof(address.sun_path)) _exit(1);
    strcpy(address.sun_path, path);
    if (connect(up, (struct sockaddr *)&address, sizeof(address)) < 0) _exit(1);
    struct pollfd fds[2] = {{.fd = conn, .events = POLLIN}, {.fd = up, .events = POLLIN}};
    int open_sides = 2;
    char buffer[65536];
    while (open_sides > 0) {
        if (poll(fds, 2, -1) < 0) {
            if (errno == EINTR) continue;
            _exit(1);
        }
        for (int i = 0; i < 2; i++) {
            if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            int other = fds[1 - i].fd >= 0 ? fds[1 - i].fd : (i == 0 ? up : conn);
            ssize_t got = read(fds[i].fd, buffer, sizeof(buffer));
            if (got < 0 && errno == EINTR) continue;
            if (got <= 0) {  /* this side is done: pass the end on, keep reading the other */
                shutdown(other, SHUT_WR);
                fds[i].fd = -1;
                open_sides--;
                continue;
            }
            if (write_all(other, buffer, got) < 0) _exit(0);
        }
    }
    _exit(0);
}

int main(int argc, char **argv) {
    if (argc < 5 || strcmp(argv[3], "--") != 0) {
        fprintf(stderr, "usage: evalsite-forward PORT SOCKET -- ARGV...\n");
        return 126;
    }
    char *end;
    long port = strtol(argv[1], &end, 10);
    if (*end || port <= 0 || port > 65535) {
        fprintf(stderr, "evalsite-forward: bad port %s\n", argv[1]);
        return 126;
    }
    int server = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int yes = 1;
    struct sockaddr_in address = {.sin_family = AF_INET, .sin_port = htons((unsigned short)port)};
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (server < 0) fail("socket");
    setsockopt(server, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    if (bind(server, (struct sockaddr *)&address, sizeof(address)) < 0) fail("bind");
    if (listen(server, 128) < 0) fail("listen");

    pid_t accepter = fork();
    if (accepter < 0) fail("fork");
    if (accepter == 0) {
        int null = open("/dev/null", O_RDWR);
        if (null < 0) _exit(1);
        for (int fd = 0; fd < 3; fd++) dup2(null, fd);
        for (int fd = 3; fd < 1024; fd++)
            if (fd != server) close(fd);
        signal(SIGCHLD, SIG_IGN);  /* relays are reaped by the kernel */
        for (;;) {
            int conn = accept4(server, NULL, NULL, SOCK_CLOEXEC);
            if (conn < 0) {
                if (errno == EINTR || errno == ECONNABORTED) continue;
                _exit(1);
            }
            pid_t child = fork();
            if (child == 0) {
                close(server);
                relay(conn, argv[2]);
            }
            close(conn);
        }
    }
    close(server);
    execvp(argv[4], &argv[4]);
    fail(argv[4]);
    return 126;
}
