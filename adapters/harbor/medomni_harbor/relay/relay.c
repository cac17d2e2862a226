/* medomni-relay: a trial's perception relay, and the job gateway's forwarder.
 *
 *   medomni-relay relay PORT SOCKET TOKEN
 *       The trial's relay. Listens on TCP PORT of every address of its network namespace
 *       (a namespace with only `lo`: the agent's container shares it) and, for each
 *       connection, connects the unix socket SOCKET, sends the request with its target
 *       prefixed by /t/TOKEN and a "Connection: close" header (one request per
 *       connection: a second one on the same connection would reach the gateway without
 *       the token, and be refused), then copies bytes both ways until both sides close.
 *       It knows its token and the socket's path, and nothing else. A TOKEN of the form
 *       @FILE is read from FILE at each connection (a relay kept for the trials of a job,
 *       given each trial's token in turn, by the harness, in its own file system, which
 *       the agent's container does not share); an empty or absent one is refused.
 *   medomni-relay forward SOCKET HOST PORT
 *       The gateway's forwarder. Listens on the unix socket SOCKET and, for each
 *       connection, connects HOST:PORT (a numeric IPv4 or IPv6 address: the image has no
 *       resolver) and copies bytes both ways.
 *
 * The socket lives in a Docker named volume mounted in both containers: the relay reaches
 * the gateway through a file, never through a network route. Each prints "medomni-relay:
 * ready" once it listens. Built static (`gcc -static -Os`), so the image needs no libc.
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
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define LINE_MAX_BYTES 8192
#define IDLE_MS (10 * 60 * 1000)
#define CONNECT_TRIES 100 /* 10 s: the forwarder may still be starting */

static void on_term(int sig) {
    (void)sig;
    _exit(0);
}

static void die(const char *what) {
    fprintf(stderr, "medomni-relay: %s: %s\n", what, strerror(errno));
    exit(1);
}

static int write_all(int fd, const char *buf, size_t len) {
    while (len > 0) {
        ssize_t n = write(fd, buf, len);
        if (n < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        buf += n;
        len -= (size_t)n;
    }
    return 0;
}

static void refuse(int client, int status, const char *reason) {
    char body[256], head[512];
    int blen = snprintf(body, sizeof body, "{\"error\": \"perception relay: %s\"}", reason);
    int hlen = snprintf(head, sizeof head,
                        "HTTP/1.0 %d %s\r\nContent-Type: application/json\r\n"
                        "Content-Length: %d\r\nConnection: close\r\n\r\n",
                        status,
                        status == 400   ? "Bad Request"
                        : status == 503 ? "Service Unavailable"
                                        : "Bad Gateway",
                        blen);
    write_all(client, head, (size_t)hlen);
    write_all(client, body, (size_t)blen);
    /* A lingering close: what the client is still sending (a request's body, refused
     * before it was read) is read and dropped until it stops, so that its writes do not
     * meet a closed socket and it reads the answer, not a broken pipe. Bounded: 256 KiB,
     * or a second without anything. */
    shutdown(client, SHUT_WR);
    char sink[4096];
    struct pollfd p = {.fd = client, .events = POLLIN};
    for (int i = 0; i < 64 && poll(&p, 1, 1000) > 0; i++)
        if (read(client, sink, sizeof sink) <= 0) break;
}

/* Copy bytes both ways until the server's side (b) has ended: its response is complete
 * (it closes after one, as asked), or nothing moves for IDLE_MS. */
static void pipe_both(int a, int b) {
    int open_ab = 1, open_ba = 1;
    char buf[16384];
    while (open_ba) {
        struct pollfd p[2] = {{open_ab ? a : -1, POLLIN, 0}, {b, POLLIN, 0}};
        int r = poll(p, 2, IDLE_MS);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return;
        for (int i = 0; i < 2; i++) {
            int from = i == 0 ? a : b, to = i == 0 ? b : a;
            int *open = i == 0 ? &open_ab : &open_ba;
            if (!*open || !(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            ssize_t n = read(from, buf, sizeof buf);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0 || write_all(to, buf, (size_t)n) < 0) {
                *open = 0;
                shutdown(to, SHUT_WR);
            }
        }
    }
}

static int connect_unix(const char *path) {
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof addr.sun_path) return -1;
    strcpy(addr.sun_path, path);
    for (int i = 0; i < CONNECT_TRIES; i++) {
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) return -1;
        if (connect(fd, (struct sockaddr *)&addr, sizeof addr) == 0) return fd;
        close(fd);
        if (errno != ENOENT && errno != ECONNREFUSED && errno != EAGAIN) return -1;
        usleep(100 * 1000);
    }
    return -1;
}

static int connect_tcp(const char *host, const char *port) {
    int p = atoi(port);
    struct sockaddr_in v4 = {.sin_family = AF_INET, .sin_port = htons((unsigned short)p)};
    struct sockaddr_in6 v6 = {.sin6_family = AF_INET6, .sin6_port = htons((unsigned short)p)};
    struct sockaddr *sa;
    socklen_t len;
    int family;
    if (inet_pton(AF_INET, host, &v4.sin_addr) == 1) {
        sa = (struct sockaddr *)&v4, len = sizeof v4, family = AF_INET;
    } else if (inet_pton(AF_INET6, host, &v6.sin6_addr) == 1) {
        sa = (struct sockaddr *)&v6, len = sizeof v6, family = AF_INET6;
    } else {
        errno = EINVAL;
        return -1;
    }
    int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    if (connect(fd, sa, len) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* The token of "@FILE": its first line, of letters, digits, '-' and '_' only, and whole
 * (one that fills the buffer may be cut: none). */
static int token_from(const char *path, char *out, size_t size) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = read(fd, out, size - 1);
    close(fd);
    if (n <= 0) return -1;
    size_t len = 0;
    while (len < (size_t)n && out[len] != '\n') {
        char c = out[len];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              c == '-' || c == '_'))
            return -1;
        len++;
    }
    if (len == 0 || len == size - 1) return -1;
    out[len] = '\0';
    return 0;
}

/* The trial's side: rewrite the request line to carry the token, then pipe. */
static void relay_one(int client, const char *socket_path, const char *given) {
    char from_file[256];
    const char *token = given;
    if (given[0] == '@') {
        if (token_from(given + 1, from_file, sizeof from_file) != 0) {
            refuse(client, 503, "no trial is attached to this relay");
            return;
        }
        token = from_file;
    }
    char line[LINE_MAX_BYTES + 1];
    size_t have = 0;
    char *eol = NULL;
    while (!eol) {
        if (have == LINE_MAX_BYTES) {
            refuse(client, 400, "request line too long");
            return;
        }
        ssize_t n = read(client, line + have, LINE_MAX_BYTES - have);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return;
        have += (size_t)n;
        line[have] = '\0';
        eol = memchr(line, '\n', have);
    }
    /* METHOD SP TARGET SP VERSION CRLF */
    char *sp1 = memchr(line, ' ', (size_t)(eol - line));
    char *sp2 = sp1 ? memchr(sp1 + 1, ' ', (size_t)(eol - sp1 - 1)) : NULL;
    if (!sp1 || !sp2 || sp1 == line) {
        refuse(client, 400, "not an HTTP request line");
        return;
    }
    char *target = sp1 + 1;
    size_t tlen = (size_t)(sp2 - target);
    /* the absolute form (a proxy-style client): keep only its path */
    if (tlen > 7 && strncmp(target, "http://", 7) == 0) {
        char *slash = memchr(target + 7, '/', tlen - 7);
        if (slash) {
            tlen -= (size_t)(slash - target);
            target = slash;
        } else {
            target = "/";
            tlen = 1;
        }
    }
    if (tlen == 0 || target[0] != '/') {
        refuse(client, 400, "the request target must be a path");
        return;
    }
    int gw = connect_unix(socket_path);
    if (gw < 0) {
        refuse(client, 502, "the perception gateway is unreachable");
        return;
    }
    char head[LINE_MAX_BYTES + 512];
    int hlen = snprintf(head, sizeof head, "%.*s /t/%s%.*s%.*s\nConnection: close\r\n",
                        (int)(sp1 - line), line, token, (int)tlen, target,
                        (int)(eol - sp2), sp2);
    if (hlen < 0 || (size_t)hlen >= sizeof head ||
        write_all(gw, head, (size_t)hlen) < 0 ||
        write_all(gw, eol + 1, have - (size_t)(eol + 1 - line)) < 0) {
        refuse(client, 502, "the perception gateway closed the connection");
        close(gw);
        return;
    }
    pipe_both(client, gw);
    close(gw);
}

static void forward_one(int client, const char *host, const char *port) {
    int gw = connect_tcp(host, port);
    if (gw < 0) {
        refuse(client, 502, "the perception gateway is unreachable");
        return;
    }
    pipe_both(client, gw);
    close(gw);
}

static void serve(int listener, int relay, char **argv) {
    printf("medomni-relay: ready\n");
    fflush(stdout);
    for (;;) {
        int client = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
        if (client < 0) {
            if (errno == EINTR || errno == ECONNABORTED || errno == EMFILE) continue;
            die("accept");
        }
        pid_t pid = fork();
        if (pid == 0) {
            close(listener);
            if (relay)
                relay_one(client, argv[3], argv[4]);
            else
                forward_one(client, argv[3], argv[4]);
            close(client);
            _exit(0);
        }
        close(client);
    }
}

int main(int argc, char **argv) {
    struct sigaction term = {.sa_handler = on_term};
    sigaction(SIGTERM, &term, NULL); /* pid 1 of a container gets no default action */
    sigaction(SIGINT, &term, NULL);
    struct sigaction chld = {.sa_handler = SIG_IGN, .sa_flags = SA_NOCLDWAIT};
    sigaction(SIGCHLD, &chld, NULL); /* connections' children are reaped by the kernel */
    signal(SIGPIPE, SIG_IGN);
    if (argc == 5 && strcmp(argv[1], "relay") == 0) {
        /* argv: relay PORT SOCKET TOKEN -> serve() reads argv[3] (socket), argv[4] (token) */
        int port = atoi(argv[2]);
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) die("socket");
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((unsigned short)port)};
        addr.sin_addr.s_addr = htonl(INADDR_ANY);
        if (bind(fd, (struct sockaddr *)&addr, sizeof addr) != 0) die("bind");
        if (listen(fd, 64) != 0) die("listen");
        serve(fd, 1, argv);
    } else if (argc == 5 && strcmp(argv[1], "forward") == 0) {
        /* argv: forward SOCKET HOST PORT -> serve() reads argv[3] (host), argv[4] (port) */
        struct sockaddr_un addr = {.sun_family = AF_UNIX};
        if (strlen(argv[2]) >= sizeof addr.sun_path) {
            fprintf(stderr, "medomni-relay: socket path too long\n");
            return 2;
        }
        strcpy(addr.sun_path, argv[2]);
        unlink(argv[2]);
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) die("socket");
        if (bind(fd, (struct sockaddr *)&addr, sizeof addr) != 0) die("bind");
        chmod(argv[2], 0666);
        if (listen(fd, 64) != 0) die("listen");
        serve(fd, 0, argv);
    }
    fprintf(stderr,
            "usage: medomni-relay relay PORT SOCKET TOKEN\n"
            "       medomni-relay forward SOCKET HOST PORT\n");
    return 2;
}
