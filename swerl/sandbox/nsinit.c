/* The local sandbox supervisor: namespaces, mounts and the privilege drop done in-process, once per sandbox.
 *
 * Built once per source version (swerl/sandbox/supervisor.py: helper_binary) and started once per
 * LocalSandboxProvider as `nsinit FD PPID`. It is a zygote: for each sandbox swerl sends it one request over the
 * SOCK_SEQPACKET socket FD, with the sandbox's own control socket attached, and it does unshare(CLONE_NEWPID) and
 * forks (then setns back into its own pid namespace): the child, I, is pid 1 of a new pid namespace, the
 * sandbox's init.
 *
 * I unshares mount, network, IPC, UTS and cgroup namespaces, mounts a size-capped tmpfs on the sandbox's
 * directory (workspace_mb), builds the sandbox's file system in it (read-only binds of /usr and the interpreter, a
 * minimal /etc and /dev, /proc, a bounded /tmp), copies the task's repository to /workspace owned by the
 * sandbox's uid, and pivots into it. Then, once, it sets what every command inherits: the limits, no groups, real
 * uid/gid = the sandbox's (its effective uid stays 0 so it can still kill, reap and fork). The zygote has already
 * set, once for all, what does not change per sandbox: no_new_privs, an empty bounding and ambient set (it refuses
 * to run with a non-empty inheritable set). Each command is one fork whose child sets all its ids to the sandbox's
 * (at that point every capability is gone: no id is 0 and nothing can be regained, the bounding set is empty), then
 * execs. Its output goes to the pipe swerl passed along, never through I.
 *
 * No process outlives its command: when a command's main process ends, I kills every other process of the sandbox
 * (kill(-1) from a pid namespace's init reaches exactly its namespace). A kill request does the same at once. When
 * swerl closes the control socket (close(), or swerl dying), I kills everything, reaps it, and exits; the kernel
 * tears the namespaces and the tmpfs down with it. Parent-death signals tie the zygote to swerl and I to the
 * zygote. I installs no signal handler (SIGCHLD is read from a signalfd): a signal sent from inside the namespace
 * to its init is dropped by the kernel, so no command can end its sandbox.
 *
 * Why C: the same supervisor in Python (one interpreter fork per sandbox) spent a third of a start in copy-on-write
 * and page-table work for the interpreter's memory, and the rest running bytecode (docs/benchmarks.md).
 *
 * Messages are NUL-terminated tokens (swerl/sandbox/supervisor.py: encode/decode), the first naming the message:
 *   swerl -> zygote, once:  config WORKSPACE WORKSPACE_MB CAP_LAST_CAP N (RLIMIT VALUE)*N N NAME*N N SUFFIX*N
 *                           N (KIND PATH ARG1 ARG2)*N          (the layout; unused arguments are empty)
 *   swerl -> zygote:        start ROOT UID ENV_DIR M CGROUP*M N (NAME=VALUE)*N   with the sandbox's control socket
 *                           attached (CGROUP: a directory whose cgroup.procs the zygote writes I's pid to before I
 *                           goes on, so the sandbox's memory and pids are capped as a whole)
 *   I -> swerl:             ready PID | error PID TEXT         (PID: I's pid on the host)
 *   swerl -> I:             exec ID CWD N ARG*N  with the output pipe's write end (and stdin's read end) attached
 *                           kill
 *   I -> swerl:             exit ID CODE | failed ID TEXT
 *
 * `nsinit --seccomp` writes the commands' seccomp filter (struct sock_filter[]) to stdout and exits: bubblewrap's
 * --seccomp takes the same program, so both runtimes refuse the same system calls.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <grp.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/sendfile.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef PR_CAP_AMBIENT
#define PR_CAP_AMBIENT 47
#define PR_CAP_AMBIENT_CLEAR_ALL 4
#endif
#ifndef CLONE_NEWCGROUP
#define CLONE_NEWCGROUP 0x02000000
#endif

#ifndef CLONE_NEWTIME
#define CLONE_NEWTIME 0x00000080
#endif

#define MESSAGE_BYTES (1 << 20) /* the largest message either side sends (supervisor.MESSAGE_BYTES) */

/* ------------------------------------------------------------------------------------------------ messages */

struct message {
    char *buf;
    size_t len;
    char **tok; /* the tokens, then room for one NULL */
    int n, at, capacity;
    int fds[2];
    int nfds;
};

static char *next(struct message *m) {
    if (m->at >= m->n) return NULL;
    return m->tok[m->at++];
}

static long next_long(struct message *m, int *ok) {
    char *t = next(m), *end;
    if (t == NULL || *t == '\0') {
        *ok = 0;
        return 0;
    }
    errno = 0;
    long v = strtol(t, &end, 10);
    if (*end != '\0' || errno != 0) *ok = 0;
    return v;
}

/* One datagram with up to 2 fds (received close-on-exec); 0 at end of file, -1 on error. */
static int receive(int sock, struct message *m) {
    struct iovec iov = {m->buf, MESSAGE_BYTES};
    char control[CMSG_SPACE(2 * sizeof(int))];
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control, .msg_controllen = sizeof control};
    ssize_t got;
    do got = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
    while (got < 0 && errno == EINTR);
    m->nfds = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c != NULL; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        int count = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
        int *fds = (int *)CMSG_DATA(c);
        for (int i = 0; i < count; i++) {
            if (m->nfds < 2) m->fds[m->nfds++] = fds[i];
            else close(fds[i]);
        }
    }
    if (got <= 0 || (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) || m->buf[got - 1] != '\0') {
        for (int i = 0; i < m->nfds; i++) close(m->fds[i]);
        m->nfds = 0;
        if (got > 0) errno = EBADMSG; /* larger than MESSAGE_BYTES, or not NUL-terminated tokens */
        return got == 0 ? 0 : -1;
    }
    m->len = (size_t)got;
    m->n = m->at = 0;
    int count = 0;
    for (size_t i = 0; i < m->len; i++) count += m->buf[i] == '\0';
    if (count + 1 > m->capacity) {
        char **tok = realloc(m->tok, (size_t)(count + 1) * sizeof *tok);
        if (tok == NULL) {
            for (int i = 0; i < m->nfds; i++) close(m->fds[i]);
            m->nfds = 0;
            return -1;
        }
        m->tok = tok;
        m->capacity = count + 1;
    }
    size_t start = 0;
    for (size_t i = 0; i < m->len; i++) {
        if (m->buf[i] == '\0') {
            m->tok[m->n++] = m->buf + start;
            start = i + 1;
        }
    }
    return 1;
}

static void close_fds(struct message *m) {
    for (int i = 0; i < m->nfds; i++) close(m->fds[i]);
    m->nfds = 0;
}

/* Send tokens (a NULL-terminated list) as one datagram; errors are ignored (swerl gone: its EOF follows). */
static void say(int sock, ...) {
    char out[2 * PATH_MAX];
    size_t len = 0;
    va_list args;
    va_start(args, sock);
    for (const char *t; (t = va_arg(args, const char *)) != NULL;) {
        size_t n = strnlen(t, sizeof out - len - 1);
        memcpy(out + len, t, n);
        len += n;
        out[len++] = '\0';
        if (len >= sizeof out - 1) break;
    }
    va_end(args);
    while (send(sock, out, len, MSG_NOSIGNAL) < 0 && errno == EINTR) {
    }
}

/* ------------------------------------------------------------------------------------------------ the config */

struct layout_entry {
    const char *kind, *path, *arg1, *arg2;
};

static struct {
    const char *workspace;
    long workspace_mb, cap_last_cap;
    int nrlimits;
    int rlimit_resource[16];
    rlim_t rlimit_value[16];
    int nignore_names, nignore_suffixes, nlayout;
    char **ignore_names, **ignore_suffixes;
    struct layout_entry *layout;
} config;

static struct message config_message;

static int rlimit_named(const char *name) {
    static const struct {
        const char *name;
        int resource;
    } known[] = {{"as", RLIMIT_AS},         {"nproc", RLIMIT_NPROC},    {"cpu", RLIMIT_CPU},
                 {"fsize", RLIMIT_FSIZE},   {"nofile", RLIMIT_NOFILE},  {"core", RLIMIT_CORE}};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (strcmp(known[i].name, name) == 0) return known[i].resource;
    return -1;
}

static int parse_config(struct message *m) {
    int ok = 1;
    const char *kind = next(m);
    if (kind == NULL || strcmp(kind, "config") != 0) return 0;
    config.workspace = next(m);
    config.workspace_mb = next_long(m, &ok);
    config.cap_last_cap = next_long(m, &ok);
    config.nrlimits = (int)next_long(m, &ok);
    if (!ok || config.workspace == NULL || config.nrlimits < 0 || config.nrlimits > 16) return 0;
    for (int i = 0; i < config.nrlimits; i++) {
        const char *name = next(m);
        config.rlimit_resource[i] = name ? rlimit_named(name) : -1;
        config.rlimit_value[i] = (rlim_t)next_long(m, &ok);
        if (config.rlimit_resource[i] < 0) return 0;
    }
    config.nignore_names = (int)next_long(m, &ok);
    if (!ok || config.nignore_names < 0 || config.nignore_names > m->n - m->at) return 0;
    config.ignore_names = &m->tok[m->at];
    m->at += config.nignore_names;
    config.nignore_suffixes = (int)next_long(m, &ok);
    if (!ok || config.nignore_suffixes < 0 || config.nignore_suffixes > m->n - m->at) return 0;
    config.ignore_suffixes = &m->tok[m->at];
    m->at += config.nignore_suffixes;
    config.nlayout = (int)next_long(m, &ok);
    if (!ok || config.nlayout < 0 || config.nlayout * 4 > m->n - m->at) return 0;
    config.layout = calloc((size_t)config.nlayout + 1, sizeof *config.layout);
    if (config.layout == NULL) return 0;
    for (int i = 0; i < config.nlayout; i++) {
        config.layout[i].kind = next(m);
        config.layout[i].path = next(m);
        config.layout[i].arg1 = next(m);
        config.layout[i].arg2 = next(m);
    }
    return ok;
}

/* ------------------------------------------------------------------------------------------------ set-up */

static char failure[PATH_MAX + 512]; /* what failed, for the error message */

static int fail(const char *what, const char *path) {
    snprintf(failure, sizeof failure, "%s %s: %s", what, path ? path : "", strerror(errno));
    return -1;
}

#define TRY(call, what, path) \
    do { \
        if ((call) != 0) return fail(what, path); \
    } while (0)

static int mkdirs(const char *path, mode_t mode) {
    char buf[PATH_MAX];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) return errno = ENAMETOOLONG, -1;
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buf, mode) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    if (mkdir(buf, mode) != 0 && errno != EEXIST) return -1;
    return 0;
}

static int copy_file(const char *source, const char *target, const struct stat *st, uid_t uid, mode_t mode) {
    int in = open(source, O_RDONLY | O_CLOEXEC);
    if (in < 0) return fail("open", source);
    int out = open(target, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (out < 0) {
        close(in);
        return fail("create", target);
    }
    int rc = 0;
    off_t offset = 0;
    while (offset < st->st_size) {
        ssize_t sent = sendfile(out, in, &offset, (size_t)(st->st_size - offset));
        if (sent < 0) {
            if (errno == EINTR) continue;
            rc = fail("copy", source);
            break;
        }
        if (sent == 0) break; /* the source shrank while being copied */
    }
    struct timespec times[2] = {st->st_atim, st->st_mtim};
    if (rc == 0 && fchown(out, uid, uid) != 0) rc = fail("chown", target);
    if (rc == 0 && futimens(out, times) != 0) rc = fail("utime", target);
    close(out);
    close(in);
    return rc;
}

static int ignored(const char *name) {
    for (int i = 0; i < config.nignore_names; i++)
        if (strcmp(name, config.ignore_names[i]) == 0) return 1;
    size_t n = strlen(name);
    for (int i = 0; i < config.nignore_suffixes; i++) {
        size_t s = strlen(config.ignore_suffixes[i]);
        if (s <= n && strcmp(name + n - s, config.ignore_suffixes[i]) == 0) return 1;
    }
    return 0;
}

/* Copy source into the existing directory target, everything owned by uid; symlinks copied as links. Modes are
 * kept without set-id bits; files keep their times; other file types (fifos, sockets, devices) are left out. */
static int copy_tree(const char *source, const char *target, uid_t uid) {
    DIR *dir = opendir(source);
    if (dir == NULL) return fail("open directory", source);
    int rc = 0;
    for (struct dirent *e; rc == 0 && (e = readdir(dir)) != NULL;) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0 || ignored(e->d_name)) continue;
        char src[PATH_MAX], dst[PATH_MAX];
        if (snprintf(src, sizeof src, "%s/%s", source, e->d_name) >= (int)sizeof src ||
            snprintf(dst, sizeof dst, "%s/%s", target, e->d_name) >= (int)sizeof dst) {
            errno = ENAMETOOLONG;
            rc = fail("copy", src);
            break;
        }
        struct stat st;
        if (lstat(src, &st) != 0) {
            rc = fail("stat", src);
        } else if (S_ISLNK(st.st_mode)) {
            char link[PATH_MAX];
            ssize_t n = readlink(src, link, sizeof link - 1);
            if (n < 0) {
                rc = fail("readlink", src);
                continue;
            }
            link[n] = '\0';
            if (symlink(link, dst) != 0) rc = fail("symlink", dst);
            else if (lchown(dst, uid, uid) != 0) rc = fail("chown", dst);
        } else if (S_ISDIR(st.st_mode)) {
            if (mkdir(dst, st.st_mode & 01777) != 0) rc = fail("mkdir", dst);
            else if ((rc = copy_tree(src, dst, uid)) == 0 && chown(dst, uid, uid) != 0) rc = fail("chown", dst);
        } else if (S_ISREG(st.st_mode)) {
            rc = copy_file(src, dst, &st, uid, st.st_mode & 0777);
        }
    }
    closedir(dir);
    return rc;
}

/* A read-only, nosuid, nodev bind of source (not its submounts) at target. */
static int ro_bind(const char *source, const char *target, int optional) {
    struct stat st;
    if (stat(source, &st) != 0) {
        if (optional && errno == ENOENT) return 0;
        return fail("stat", source);
    }
    if (S_ISDIR(st.st_mode)) {
        TRY(mkdirs(target, 0755), "mkdir", target);
    } else {
        int fd = open(target, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0) return fail("create", target);
        close(fd);
    }
    TRY(mount(source, target, NULL, MS_BIND, NULL), "bind", source);
    TRY(mount(NULL, target, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, NULL), "remount", target);
    return 0;
}

/* A minimal /dev: the harmless character devices, a private pts instance, shm, the fd links. */
static int make_dev(const char *path) {
    static const struct {
        const char *name;
        int major, minor;
    } devices[] = {{"null", 1, 3}, {"zero", 1, 5}, {"full", 1, 7}, {"random", 1, 8}, {"urandom", 1, 9}, {"tty", 5, 0}};
    static const char *links[][2] = {{"fd", "/proc/self/fd"},         {"stdin", "/proc/self/fd/0"},
                                     {"stdout", "/proc/self/fd/1"},   {"stderr", "/proc/self/fd/2"},
                                     {"ptmx", "pts/ptmx"}};
    char p[PATH_MAX + 64];
    TRY(mkdirs(path, 0755), "mkdir", path);
    TRY(mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NOEXEC, "size=1m,mode=0755"), "mount tmpfs on", path);
    for (size_t i = 0; i < sizeof devices / sizeof devices[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", path, devices[i].name);
        TRY(mknod(p, S_IFCHR | 0666, makedev(devices[i].major, devices[i].minor)), "mknod", p);
    }
    snprintf(p, sizeof p, "%s/shm", path);
    TRY(mkdir(p, 01777), "mkdir", p);
    snprintf(p, sizeof p, "%s/pts", path);
    TRY(mkdir(p, 0755), "mkdir", p);
    TRY(mount("devpts", p, "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=620"), "mount devpts on", p);
    for (size_t i = 0; i < sizeof links / sizeof links[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", path, links[i][0]);
        TRY(symlink(links[i][1], p), "symlink", p);
    }
    return 0;
}

static int write_new(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return fail("create", path);
    size_t len = strlen(text);
    int rc = write(fd, text, len) == (ssize_t)len ? 0 : fail("write", path);
    close(fd);
    return rc;
}

/* Bring the new network namespace's loopback up (as bubblewrap does): 127.0.0.1 inside, nothing outside. */
static int loopback_up(void) {
    int s = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0); /* any socket reaches the device ioctls */
    if (s < 0) return fail("socket", "for lo");
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    strcpy(ifr.ifr_name, "lo");
    ifr.ifr_flags = IFF_UP | IFF_LOOPBACK | IFF_RUNNING;
    int rc = ioctl(s, SIOCSIFFLAGS, &ifr) == 0 ? 0 : fail("bring up", "lo");
    close(s);
    return rc;
}

static long mode_of(const char *text) { return strtol(text, NULL, 10); }

/* The sandbox's file system on a tmpfs at root, then pivot_root into it. */
static int build_root(const char *root, uid_t uid, const char *env_dir) {
    char path[PATH_MAX], data[128];
    TRY(mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL), "make private", "/");
    snprintf(data, sizeof data, "size=%ldm,mode=0755", config.workspace_mb);
    TRY(mount("swerl-sandbox", root, "tmpfs", MS_NOSUID | MS_NODEV, data), "mount tmpfs on", root);
    umask(0);
    for (int i = 0; i < config.nlayout; i++) {
        const struct layout_entry *e = &config.layout[i];
        if (snprintf(path, sizeof path, "%s%s", root, e->path) >= (int)sizeof path) return errno = ENAMETOOLONG, fail("layout", e->path);
        if (strcmp(e->kind, "dir") == 0) {
            TRY(mkdirs(path, (mode_t)mode_of(e->arg1)), "mkdir", path);
        } else if (strcmp(e->kind, "symlink") == 0) {
            TRY(symlink(e->arg1, path), "symlink", path);
        } else if (strcmp(e->kind, "ro-bind") == 0 || strcmp(e->kind, "ro-bind-try") == 0) {
            if (ro_bind(e->arg1, path, strcmp(e->kind, "ro-bind-try") == 0) != 0) return -1;
        } else if (strcmp(e->kind, "copy-try") == 0) {
            struct stat st;
            if (stat(e->arg1, &st) != 0) {
                if (errno == ENOENT) continue;
                return fail("stat", e->arg1);
            }
            if (copy_file(e->arg1, path, &st, 0, 0644) != 0) return -1;
        } else if (strcmp(e->kind, "tmpfs") == 0) {
            TRY(mkdirs(path, 0755), "mkdir", path);
            snprintf(data, sizeof data, "size=%sm,mode=%lo", e->arg1, mode_of(e->arg2));
            TRY(mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, data), "mount tmpfs on", path);
        } else if (strcmp(e->kind, "proc") == 0) {
            TRY(mkdirs(path, 0555), "mkdir", path);
            TRY(mount("proc", path, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL), "mount proc on", path);
        } else if (strcmp(e->kind, "dev") == 0) {
            if (make_dev(path) != 0) return -1;
        } else {
            errno = EINVAL;
            return fail("unknown layout entry", e->kind);
        }
    }
    char text[256];
    snprintf(path, sizeof path, "%s/etc", root);
    TRY(mkdirs(path, 0755), "mkdir", path);
    snprintf(path, sizeof path, "%s/etc/passwd", root);
    snprintf(text, sizeof text, "root:x:0:0:root:/root:/bin/sh\nsandbox:x:%u:%u:sandbox:/tmp:/bin/bash\n", uid, uid);
    if (write_new(path, text) != 0) return -1;
    snprintf(path, sizeof path, "%s/etc/group", root);
    snprintf(text, sizeof text, "root:x:0:\nsandbox:x:%u:\n", uid);
    if (write_new(path, text) != 0) return -1;
    snprintf(path, sizeof path, "%s%s", root, config.workspace);
    TRY(mkdir(path, 0755), "mkdir", path);
    if (copy_tree(env_dir, path, uid) != 0) return -1;
    TRY(chown(path, uid, uid), "chown", path);
    umask(022);
    if (loopback_up() != 0) return -1;
    TRY(chdir(root), "chdir", root);
    TRY((int)syscall(SYS_pivot_root, ".", "."), "pivot_root", root);
    TRY(umount2(".", MNT_DETACH), "detach the host's root", "");
    TRY(chdir("/"), "chdir", "/");
    return 0;
}

/* What every command inherits from I: limits, not dumpable, no groups, real ids = uid (euid 0 stays: I still
 * kills, reaps and forks; each command's child sets all its ids to uid before its exec). The limits bind I too:
 * one process of the uid's RLIMIT_NPROC is I's, hence the + 1. */
static int drop_privileges(uid_t uid) {
    TRY(prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl", "PR_SET_DUMPABLE");
    for (int i = 0; i < config.nrlimits; i++) {
        rlim_t value = config.rlimit_value[i] + (config.rlimit_resource[i] == RLIMIT_NPROC ? 1 : 0);
        struct rlimit limit = {value, value};
        TRY(setrlimit(config.rlimit_resource[i], &limit), "setrlimit", "");
    }
    TRY(setgroups(0, NULL), "setgroups", "");
    TRY(setresgid(uid, 0, 0), "setresgid", "");
    TRY(setresuid(uid, 0, 0), "setresuid", ""); /* euid 0 stays: no capability is lost while one id is 0 */
    return 0;
}

/* ------------------------------------------------------------------------------------------------ seccomp */

/* The filter every command runs under (installed in its child just before exec; no_new_privs is already set). It
 * refuses with EPERM what a sandboxed process never needs and what would widen its reach: new namespaces (a user
 * namespace gives a child namespace with every capability), joining one, mounts, kernel modules, ptrace and
 * cross-process memory access, kexec, bpf, perf events, the kernel keyring, reboot, swap, io_uring (which runs
 * system calls the filter never sees) and the like. clone3 gets ENOSYS (its flags are behind a pointer the filter
 * cannot read; libc then falls back to clone, whose flags it checks). Another architecture's system calls (i386 on
 * x86_64, x32) are refused too: the numbers below are this one's. */
#if defined(__x86_64__)
#define SECCOMP_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define SECCOMP_ARCH AUDIT_ARCH_AARCH64
#elif defined(__i386__)
#define SECCOMP_ARCH AUDIT_ARCH_I386
#elif defined(__riscv) && __riscv_xlen == 64
#define SECCOMP_ARCH AUDIT_ARCH_RISCV64
#else
#error "no seccomp architecture for this target: add its AUDIT_ARCH_ constant"
#endif

#define NAMESPACE_FLAGS \
    (CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET)

static const long refused_syscalls[] = {
#define REFUSE(name) SYS_##name,
#ifdef SYS_setns
    REFUSE(setns)
#endif
#ifdef SYS_mount
    REFUSE(mount)
#endif
#ifdef SYS_umount
    REFUSE(umount)
#endif
#ifdef SYS_umount2
    REFUSE(umount2)
#endif
#ifdef SYS_pivot_root
    REFUSE(pivot_root)
#endif
#ifdef SYS_chroot
    REFUSE(chroot)
#endif
#ifdef SYS_fsopen
    REFUSE(fsopen)
#endif
#ifdef SYS_fsconfig
    REFUSE(fsconfig)
#endif
#ifdef SYS_fsmount
    REFUSE(fsmount)
#endif
#ifdef SYS_fspick
    REFUSE(fspick)
#endif
#ifdef SYS_move_mount
    REFUSE(move_mount)
#endif
#ifdef SYS_open_tree
    REFUSE(open_tree)
#endif
#ifdef SYS_mount_setattr
    REFUSE(mount_setattr)
#endif
#ifdef SYS_init_module
    REFUSE(init_module)
#endif
#ifdef SYS_finit_module
    REFUSE(finit_module)
#endif
#ifdef SYS_delete_module
    REFUSE(delete_module)
#endif
#ifdef SYS_kexec_load
    REFUSE(kexec_load)
#endif
#ifdef SYS_kexec_file_load
    REFUSE(kexec_file_load)
#endif
#ifdef SYS_ptrace
    REFUSE(ptrace)
#endif
#ifdef SYS_process_vm_readv
    REFUSE(process_vm_readv)
#endif
#ifdef SYS_process_vm_writev
    REFUSE(process_vm_writev)
#endif
#ifdef SYS_kcmp
    REFUSE(kcmp)
#endif
#ifdef SYS_bpf
    REFUSE(bpf)
#endif
#ifdef SYS_perf_event_open
    REFUSE(perf_event_open)
#endif
#ifdef SYS_keyctl
    REFUSE(keyctl)
#endif
#ifdef SYS_add_key
    REFUSE(add_key)
#endif
#ifdef SYS_request_key
    REFUSE(request_key)
#endif
#ifdef SYS_reboot
    REFUSE(reboot)
#endif
#ifdef SYS_swapon
    REFUSE(swapon)
#endif
#ifdef SYS_swapoff
    REFUSE(swapoff)
#endif
#ifdef SYS_acct
    REFUSE(acct)
#endif
#ifdef SYS_quotactl
    REFUSE(quotactl)
#endif
#ifdef SYS_userfaultfd
    REFUSE(userfaultfd)
#endif
#ifdef SYS_open_by_handle_at
    REFUSE(open_by_handle_at)
#endif
#ifdef SYS_io_uring_setup
    REFUSE(io_uring_setup)
#endif
#ifdef SYS_io_uring_enter
    REFUSE(io_uring_enter)
#endif
#ifdef SYS_io_uring_register
    REFUSE(io_uring_register)
#endif
#ifdef SYS_iopl
    REFUSE(iopl)
#endif
#ifdef SYS_ioperm
    REFUSE(ioperm)
#endif
#ifdef SYS_syslog
    REFUSE(syslog)
#endif
#ifdef SYS_lookup_dcookie
    REFUSE(lookup_dcookie)
#endif
#ifdef SYS_uselib
    REFUSE(uselib)
#endif
#ifdef SYS_settimeofday
    REFUSE(settimeofday)
#endif
#ifdef SYS_clock_settime
    REFUSE(clock_settime)
#endif
#ifdef SYS_clock_adjtime
    REFUSE(clock_adjtime)
#endif
#undef REFUSE
};

#define NREFUSED (sizeof refused_syscalls / sizeof refused_syscalls[0])
#define FILTER_MAX (8 + 2 * NREFUSED + 2 + 2 * 5 + 1)
static struct sock_filter filter[FILTER_MAX];
static unsigned short filter_len;

#define EMIT(code, k, jt, jf) (filter[filter_len++] = (struct sock_filter)BPF_JUMP(code, k, jt, jf))
#define RET_ERRNO(e) (SECCOMP_RET_ERRNO | ((e) & SECCOMP_RET_DATA))

/* An `nr` whose first argument (flags; the low 32 bits hold them all) has any of `flags` gets EPERM. */
static void refuse_flags(long nr, unsigned int flags) {
    EMIT(BPF_JMP | BPF_JEQ | BPF_K, (unsigned int)nr, 0, 4);
    EMIT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0]), 0, 0);
    EMIT(BPF_JMP | BPF_JSET | BPF_K, flags, 0, 1);
    EMIT(BPF_RET | BPF_K, RET_ERRNO(EPERM), 0, 0);
    EMIT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW, 0, 0);
}

static void build_filter(void) {
    filter_len = 0;
    EMIT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch), 0, 0);
    EMIT(BPF_JMP | BPF_JEQ | BPF_K, SECCOMP_ARCH, 1, 0);
    EMIT(BPF_RET | BPF_K, RET_ERRNO(EPERM), 0, 0);
    EMIT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr), 0, 0);
#if defined(__x86_64__)
    EMIT(BPF_JMP | BPF_JGE | BPF_K, 0x40000000u, 0, 1); /* x32 system calls */
    EMIT(BPF_RET | BPF_K, RET_ERRNO(EPERM), 0, 0);
#endif
    for (size_t i = 0; i < NREFUSED; i++) {
        EMIT(BPF_JMP | BPF_JEQ | BPF_K, (unsigned int)refused_syscalls[i], 0, 1);
        EMIT(BPF_RET | BPF_K, RET_ERRNO(EPERM), 0, 0);
    }
#ifdef SYS_clone3
    EMIT(BPF_JMP | BPF_JEQ | BPF_K, SYS_clone3, 0, 1);
    EMIT(BPF_RET | BPF_K, RET_ERRNO(ENOSYS), 0, 0);
#endif
    refuse_flags(SYS_unshare, NAMESPACE_FLAGS | CLONE_NEWTIME);
    refuse_flags(SYS_clone, NAMESPACE_FLAGS); /* clone's low byte is the exit signal, not CLONE_NEWTIME */
    EMIT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW, 0, 0);
}

static int install_filter(void) {
    struct sock_fprog program = {filter_len, filter};
    return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program, 0, 0);
}

/* ------------------------------------------------------------------------------------------------ commands */

static struct command {
    pid_t pid;
    char id[32];
} *running; /* the commands running now (swerl runs one at a time per sandbox; more are allowed) */
static int nrunning, running_capacity;

static void kill_all(void) { kill(-1, SIGKILL); } /* every process of this pid namespace but I */

/* Remember a running command; -1 when out of memory. */
static int track(pid_t pid, const char *id) {
    if (nrunning == running_capacity) {
        struct command *grown = realloc(running, sizeof *running * (size_t)(running_capacity + 8));
        if (grown == NULL) return -1;
        running = grown;
        running_capacity += 8;
    }
    running[nrunning].pid = pid;
    snprintf(running[nrunning].id, sizeof running[nrunning].id, "%s", id);
    nrunning++;
    return 0;
}

/* The commands' oom_score_adj (swerl's own): I runs at -1000, so a full memory cgroup's OOM killer picks one of
 * the commands' processes, never the sandbox's init. */
static char command_oom_score_adj[16] = "0";

static int oom_score_adj_write(const char *value) {
    int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = write(fd, value, strlen(value));
    close(fd);
    return n == (ssize_t)strlen(value) ? 0 : -1;
}

/* Start one command: a fork whose child becomes the sandbox's user and execs argv. 0, or -1 with `failure` set. */
static pid_t spawn(uid_t uid, char **envp, const char *cwd, char **argv, struct message *m) {
    int report[2];
    if (pipe2(report, O_CLOEXEC) != 0) return fail("pipe", ""), -1;
    pid_t pid = fork();
    if (pid < 0) {
        close(report[0]);
        close(report[1]);
        return fail("fork", argv[0]), -1;
    }
    if (pid == 0) {
        const char *step = "dup";
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        if (setsid() < 0) step = "setsid";
        else if (m->nfds > 1 ? dup2(m->fds[1], 0) < 0 : (close(0), open("/dev/null", O_RDONLY) != 0)) step = "stdin";
        else if (dup2(m->fds[0], 1) < 0 || dup2(m->fds[0], 2) < 0) step = "stdout";
        else if (chdir(cwd) != 0) step = "chdir";
        else if (oom_score_adj_write(command_oom_score_adj) != 0) step = "oom_score_adj";
        else if (setresgid(uid, uid, uid) != 0 || setresuid(uid, uid, uid) != 0) step = "set ids";
        else if (install_filter() != 0) step = "seccomp";
        else {
            step = "exec";
            execve(argv[0], argv, envp);
        }
        int code = errno;
        char out[256];
        int n = snprintf(out, sizeof out, "%s %s: %s", step, step[0] == 'c' ? cwd : argv[0], strerror(code));
        (void)!write(report[1], out, (size_t)n);
        _exit(127);
    }
    close(report[1]);
    ssize_t n;
    do n = read(report[0], failure, sizeof failure - 1);
    while (n < 0 && errno == EINTR);
    close(report[0]);
    if (n > 0) { /* the child said why it could not exec, and ended */
        failure[n] = '\0';
        waitpid(pid, NULL, 0);
        return -1;
    }
    return pid;
}

static void reap(int ctl) {
    for (;;) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid <= 0) return;
        int at = -1;
        for (int i = 0; i < nrunning; i++)
            if (running[i].pid == pid) at = i;
        if (at < 0) continue; /* a command's orphan, reparented to I */
        char id[32], code[16];
        memcpy(id, running[at].id, sizeof id);
        running[at] = running[--nrunning];
        if (nrunning == 0) kill_all(); /* nothing outlives its command (and the output pipe reaches end of file) */
        snprintf(code, sizeof code, "%d", WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
        say(ctl, "exit", id, code, NULL);
    }
}

/* Run commands until swerl closes the control socket; then kill and reap everything, and return. */
static int serve(int ctl, uid_t uid, char **envp, struct message *m, int sfd) {
    struct pollfd fds[2] = {{ctl, POLLIN, 0}, {sfd, POLLIN, 0}};
    for (;;) {
        if (poll(fds, 2, -1) < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (fds[1].revents) {
            struct signalfd_siginfo info[16];
            while (read(sfd, info, sizeof info) > 0) {
            }
            reap(ctl);
        }
        if (!fds[0].revents) continue;
        int got = receive(ctl, m);
        if (got <= 0) break;
        const char *op = next(m);
        if (op != NULL && strcmp(op, "exec") == 0) {
            int ok = 1;
            char *id = next(m), *cwd = next(m);
            long argc = next_long(m, &ok);
            if (!ok || id == NULL || cwd == NULL || argc < 1 || argc > m->n - m->at || m->nfds < 1) {
                say(ctl, "failed", id ? id : "", "malformed exec request", NULL);
            } else {
                char **argv = &m->tok[m->at];
                m->tok[m->at + argc] = NULL; /* the token array has room for one NULL after the last token */
                pid_t pid = spawn(uid, envp, cwd, argv, m);
                if (pid < 0) {
                    say(ctl, "failed", id, failure, NULL);
                } else if (track(pid, id) != 0) {
                    kill_all();
                    say(ctl, "failed", id, "out of memory", NULL);
                }
            }
        } else if (op != NULL && strcmp(op, "kill") == 0) {
            kill_all();
        }
        close_fds(m);
    }
    kill_all();
    while (waitpid(-1, NULL, 0) > 0 || errno == EINTR) {
    }
    return 0;
}

/* pid 1 of the sandbox: its namespaces and file system, then its commands until swerl lets go. */
static int init(int ctl, struct message *request, int gate) {
    /* Dies with the zygote (outside this pid namespace, getppid() is 0, so a zygote that ended before this call
     * goes unseen; the control socket still ends this sandbox when swerl closes it or dies). */
    prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    signal(SIGCHLD, SIG_DFL);
    char host_pid[32] = "0";
    /* The host's procfs (still mounted here) names this process by its pid out there, the one swerl needs. */
    ssize_t n = readlink("/proc/self", host_pid, sizeof host_pid - 1);
    host_pid[n > 0 ? n : 1] = '\0';
    /* The zygote has put this process into the sandbox's cgroups (or says why not) before anything is charged. */
    char why[512];
    ssize_t said;
    do said = read(gate, why, sizeof why - 1);
    while (said < 0 && errno == EINTR);
    close(gate);
    if (said > 0) {
        why[said] = '\0';
        say(ctl, "error", host_pid, why, NULL);
        return 1;
    }
    int ok = 1;
    const char *root = next(request), *env_dir;
    long uid = next_long(request, &ok);
    env_dir = next(request);
    long ncgroups = next_long(request, &ok);
    if (ok && ncgroups >= 0 && ncgroups <= request->n - request->at) request->at += (int)ncgroups;
    else ok = 0;
    long nenv = next_long(request, &ok);
    if (!ok || root == NULL || env_dir == NULL || uid <= 0 || nenv < 0 || nenv > request->n - request->at) {
        say(ctl, "error", host_pid, "malformed start request", NULL);
        return 1;
    }
    char **envp = &request->tok[request->at];
    request->tok[request->at + nenv] = NULL;
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    int sfd = -1;
    int adj = open("/proc/self/oom_score_adj", O_RDONLY | O_CLOEXEC);
    if (adj >= 0) {
        ssize_t got = read(adj, command_oom_score_adj, sizeof command_oom_score_adj - 1);
        command_oom_score_adj[got > 0 ? got : 0] = '\0';
        if (got <= 0) strcpy(command_oom_score_adj, "0");
        close(adj);
    }
    oom_score_adj_write("-1000"); /* best effort (needs CAP_SYS_RESOURCE, which I still has) */
    int flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS;
    if (unshare(flags | CLONE_NEWCGROUP) != 0 && unshare(flags) != 0) { /* kernels without cgroup namespaces */
        fail("unshare", "");
    } else if (build_root(root, (uid_t)uid, env_dir) == 0 && drop_privileges((uid_t)uid) == 0) {
        sigprocmask(SIG_BLOCK, &chld, NULL);
        sfd = signalfd(-1, &chld, SFD_NONBLOCK | SFD_CLOEXEC);
        if (sfd < 0) fail("signalfd", "");
    }
    if (sfd < 0) {
        say(ctl, "error", host_pid, failure, NULL);
        return 1;
    }
    say(ctl, "ready", host_pid, NULL);
    /* A second buffer for commands: the request's tokens (the environment) stay where they are. */
    struct message *commands = calloc(1, sizeof *commands);
    if (commands == NULL || (commands->buf = malloc(MESSAGE_BYTES)) == NULL) return 1;
    return serve(ctl, (uid_t)uid, envp, commands, sfd);
}

/* ------------------------------------------------------------------------------------------------ the zygote */

/* Once for every sandbox: no_new_privs, empty ambient and bounding sets; refuses a non-empty inheritable set. */
static int restrict_capabilities(void) {
    FILE *status = fopen("/proc/self/status", "re");
    if (status == NULL) return fail("open", "/proc/self/status");
    char line[256];
    unsigned long long inheritable = ~0ULL;
    while (fgets(line, sizeof line, status) != NULL)
        if (strncmp(line, "CapInh:", 7) == 0) inheritable = strtoull(line + 7, NULL, 16);
    fclose(status);
    if (inheritable != 0) {
        snprintf(failure, sizeof failure, "swerl's inheritable capabilities are not empty (%llx): refusing", inheritable);
        return -1;
    }
    TRY(prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl", "PR_SET_NO_NEW_PRIVS");
    TRY(prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "prctl", "clear ambient capabilities");
    for (long cap = 0; cap <= config.cap_last_cap; cap++)
        TRY(prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), "prctl", "PR_CAPBSET_DROP");
    return 0;
}

/* Put pid into each cgroup the start request names (start ROOT UID ENV_DIR M CGROUP*M ...); 0, or -1 with
 * `failure` set. */
static int join_cgroups(struct message *request, pid_t pid) {
    if (request->n < 5) return errno = EINVAL, fail("start request", "without cgroups");
    char *end;
    long count = strtol(request->tok[4], &end, 10);
    if (*end != '\0' || count < 0 || count > request->n - 5) return errno = EINVAL, fail("start request", "cgroups");
    char text[32], path[PATH_MAX];
    int n = snprintf(text, sizeof text, "%d", (int)pid);
    for (long i = 0; i < count; i++) {
        const char *dir = request->tok[5 + i];
        if (snprintf(path, sizeof path, "%s/cgroup.procs", dir) >= (int)sizeof path) return errno = ENAMETOOLONG, fail("cgroup", dir);
        int fd = open(path, O_WRONLY | O_CLOEXEC);
        if (fd < 0) return fail("open", path);
        ssize_t wrote = write(fd, text, (size_t)n);
        int saved = errno;
        close(fd);
        if (wrote != n) return errno = saved, fail("join cgroup", dir);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "--seccomp") == 0) {
        build_filter();
        size_t bytes = filter_len * sizeof filter[0];
        return fwrite(filter, 1, bytes, stdout) == bytes && fflush(stdout) == 0 ? 0 : 1;
    }
    if (argc != 3) {
        fprintf(stderr, "usage: %s FD PPID (started by swerl/sandbox/supervisor.py)\n", argv[0]);
        return 2;
    }
    int sock = atoi(argv[1]);
    prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    if (getppid() != (pid_t)atol(argv[2])) return 1; /* swerl already ended */
    config_message.buf = malloc(MESSAGE_BYTES);
    struct message *request = calloc(1, sizeof *request);
    if (config_message.buf == NULL || request == NULL || (request->buf = malloc(MESSAGE_BYTES)) == NULL) return 1;
    if (receive(sock, &config_message) <= 0 || !parse_config(&config_message)) {
        fprintf(stderr, "nsinit: no valid config message\n");
        return 1;
    }
    close_fds(&config_message);
    build_filter();
    /* A refusal is every start's answer (swerl reports it as that start's InfraError). */
    int refused = restrict_capabilities() != 0;
    signal(SIGCHLD, SIG_IGN); /* the kernel reaps each init: nothing here waits for one */
    int own_pid_ns = open("/proc/self/ns/pid", O_RDONLY | O_CLOEXEC);
    if (own_pid_ns < 0) {
        perror("nsinit: /proc/self/ns/pid");
        return 1;
    }
    for (;;) {
        int got = receive(sock, request);
        if (got == 0) return 0; /* swerl closed the launcher (or ended) */
        if (got < 0) {
            if (errno == EINTR) continue;
            return 1;
        }
        const char *kind = next(request);
        if (request->nfds != 1 || kind == NULL || strcmp(kind, "start") != 0) {
            close_fds(request);
            continue;
        }
        int ctl = request->fds[0];
        if (refused) {
            say(ctl, "error", "0", failure, NULL);
            close(ctl);
            continue;
        }
        pid_t pid = -1;
        int gate[2];
        if (pipe2(gate, O_CLOEXEC) != 0) {
            snprintf(failure, sizeof failure, "cannot start a sandbox: pipe: %s", strerror(errno));
            say(ctl, "error", "0", failure, NULL);
            close(ctl);
            continue;
        }
        /* fork(), the child being pid 1 of a new pid namespace; this process stays in (and forks into) its own. */
        if (unshare(CLONE_NEWPID) == 0) {
            pid = fork();
            if (pid != 0 && setns(own_pid_ns, CLONE_NEWPID) != 0) {
                perror("nsinit: setns(own pid namespace)");
                return 1;
            }
        }
        if (pid == 0) {
            close(sock);
            close(own_pid_ns);
            close(gate[1]);
            _exit(init(ctl, request, gate[0]));
        }
        close(gate[0]);
        if (pid > 0 && join_cgroups(request, pid) != 0) /* the init reads why, says it, and ends */
            (void)!write(gate[1], failure, strnlen(failure, 500));
        close(gate[1]);
        if (pid < 0) {
            snprintf(failure, sizeof failure, "cannot start a sandbox: %s", strerror(errno));
            say(ctl, "error", "0", failure, NULL);
        }
        close(ctl);
    }
}
