/* A fake libnccl.so.2 for multi-process "gang" tests (issue 12): the NCCL calls
 * a job-wide check makes, implemented across processes for real, over TCP, on
 * host memory. No GPU, no CUDA: buffers are host pointers (the fake libcuda's
 * cuMemAlloc_v2 hands out malloc'd memory, so its "device pointers" work here),
 * stream arguments are ignored and every operation has completed when its call
 * (or the ncclGroupEnd that runs it) returns.
 *
 * ABI (NVIDIA/nccl src/nccl.h.in, v2.21.5-1 and v2.28.9-1): ncclResult_t values
 * 0-7, ncclUniqueId of 128 bytes, ncclConfig_t starting {size, magic 0xcafebeef,
 * version, blocking, ...} of which only the caller's `size` bytes are read (as
 * init.cc parseCommConfig does, so an older header's smaller struct works),
 * ncclDataType_t (int8 0 ... float64 8, bfloat16 9, fp8 10-11) and ncclRedOp_t
 * (sum 0, prod 1, max 2, min 3, avg 4).
 *
 * Implemented: ncclGetVersion, ncclGetErrorString, ncclGetLastError,
 * ncclGetUniqueId, ncclCommInitRank, ncclCommInitRankConfig, ncclCommAbort,
 * ncclCommDestroy, ncclCommFinalize, ncclCommGetAsyncError, ncclCommCount,
 * ncclCommUserRank, ncclCommCuDevice, ncclGroupStart, ncclGroupEnd,
 * ncclAllGather, ncclAllReduce, ncclBroadcast, ncclSend, ncclRecv. Everything
 * else is absent, so a caller that resolves it with dlsym learns so.
 *
 * Bootstrap, as NCCL does it with NCCL_COMM_ID (src/bootstrap.cc
 * bootstrapGetUniqueId, src/init.cc "start the bootstrap root before
 * bootstrapping"): ncclGetUniqueId encodes the NCCL_COMM_ID address (after an
 * 8-byte magic, 0x0280028002800280 as NCCL_MAGIC, like ncclBootstrapHandle) and
 * starts nothing; rank 0's ncclCommInitRank listens at that address, every rank
 * connects to it (retrying refused connections NCCL_SOCKET_RETRY_CNT times,
 * default 34, sleeping n * NCCL_SOCKET_RETRY_SLEEP_MSEC ms, default 100, before
 * attempt n+1, as src/misc/socket.cc does) and registers its rank, NCCL version,
 * device and a listening address on the interface that reaches the root; the
 * root answers everyone with the whole table; ranks then build a full TCP mesh
 * (each connects to every lower rank). Without NCCL_COMM_ID ncclGetUniqueId
 * fails with ncclInvalidUsage: this fake has no out-of-band root. Init takes
 * any non-zero magic (an id built by hand as NCCL lays it out works, as with
 * NCCL), refuses (ncclInvalidArgument) a zero one, and the root drops a rank
 * whose id carries another magic and keeps waiting, as NCCL's does.
 *
 * Like NCCL (init.cc, after the first bootstrap all-gather), ranks whose NCCL
 * versions differ all fail init with ncclInvalidUsage and "Mismatched NCCL
 * version detected : rank A version X rank B version Y". With
 * FAKE_NCCL_MISMATCH_HANG=1 a rank instead sends a shorter bootstrap hello, as
 * another version's layout can be, and no rank's join ever completes (what
 * real NCCL did with 4 pods, one on 2.28.3 among 2.28.9).
 *
 * Waits: like NCCL the root waits for every rank without a time limit and
 * ncclCommAbort interrupts it (and any pending init or operation) within about
 * 100 ms. FAKE_NCCL_INIT_TIMEOUT_MS / FAKE_NCCL_OP_TIMEOUT_MS bound them here
 * as a backstop (ncclRemoteError); NCCL has no such limit.
 *
 * Groups: ncclGroupStart/End nest per thread. Inits and operations queued
 * inside a group run at the outermost ncclGroupEnd, one thread per
 * communicator, so one process drives several local "GPUs" (communicators), as
 * a trainer with nranks = nodes x local GPUs does. A non-blocking
 * communicator's (config->blocking = 0, or NCCL_COMM_BLOCKING=0) init returns
 * ncclInProgress and finishes on a background thread; ncclCommGetAsyncError
 * reports ncclInProgress until then. Operations always complete before their
 * call returns, blocking or not.
 *
 * Data movement: ncclSend/ncclRecv point to point between any two ranks (a
 * group's sends and receives progress together, so ring shifts do not
 * deadlock); ncclAllGather and ncclBroadcast directly over the mesh;
 * ncclAllReduce as reduce-scatter then all-gather over the mesh, so each rank
 * moves 2(n-1)/n of the buffer as NCCL's ring does (busbw stays meaningful), and
 * every rank reduces in rank order, so floating-point results are identical
 * everywhere. Reductions: all ops on int8/uint8/int32/uint32/int64/uint64/
 * float32/float64; float16/bfloat16/fp8 are moved but not reduced
 * (ncclInvalidArgument). Every message carries a small header, so calls that
 * do not match across ranks fail with ncclInvalidUsage instead of corrupting
 * data. A peer that dies makes the operations that talk to it fail with
 * ncclRemoteError, also reported by ncclCommGetAsyncError (NCCL reports it
 * asynchronously and leaves the kernel to be aborted).
 *
 * Logging: NCCL_DEBUG=INFO (or TRACE) prints NCCL-style lines
 * ("host:pid:tid [dev] NCCL INFO ...", src/debug.cc) to stderr or
 * NCCL_DEBUG_FILE (%h host, %p pid), in the formats explain-log parses: "NCCL
 * version X.Y.Z+cudaA.B", "NCCL_COMM_ID set by environment to ...", "Init
 * START" with a commId every rank shares, "Bootstrap: Using if:ip<0>", for
 * NET/Socket "NET/Socket : Using [0]if:ip<0>", "Using network N", "comm ...
 * nRanks n nNodes m localRanks l localRank k" (nodes counted by NCCL_HOSTID,
 * else the host name, as NCCL's host hash), one "Channel 00/0 : a[da] -> b[db]
 * [send] via T" and one "[receive]" line per peer, and "Init COMPLETE".
 * NCCL_DEBUG=WARN (and INFO) prints WARN lines. Every WARN also becomes
 * ncclGetLastError's answer, as in NCCL.
 *
 * Interface rule, as NCCL's bootstrapNetInit: with NCCL_COMM_ID set, a process
 * none of whose interfaces is in NCCL_COMM_ID's subnet (by the local netmask)
 * fails init with ncclSystemError and "NET/Socket : No usable listening
 * interface found", and keeps failing (the result is cached per process).
 *
 * Differences from NCCL: no CUDA (host buffers, synchronous), no topology,
 * one TCP connection per pair of ranks whatever the transport named in the log,
 * no duplicate-GPU check, no ncclCommSplit/ReduceScatter/Reduce/registration,
 * ncclGetUniqueId needs NCCL_COMM_ID. A communicator's device is the lowest
 * device number no other live communicator of this process holds (0, 1, ...).
 *
 * Scenario knobs (environment):
 *   FAKE_NCCL_VERSION=N        ncclGetVersion's answer, also exchanged at init (default 22809)
 *   FAKE_NCCL_DIAG_FILE=PATH   with NCCL_RUN_RAS_DIAGNOSTICS=1 and a version of 2.31 or
 *                              later, rank 0's init prints the body of each "NCCL DIAG"
 *                              line of PATH as "host:pid NCCL DIAG body", as NCCL 2.32.3
 *                              printed its RAS diagnostics at init (tests/data/ras/
 *                              gpu-h200x4-2.32.3/rank0.log)
 *   FAKE_NCCL_CUDA=X.Y         the "+cudaX.Y" of the logged version line (default 12.8)
 *   FAKE_NCCL_TRANSPORT=T      the transport the Channel lines name (default NET/Socket/0)
 *   FAKE_NCCL_DIE_AFTER=N      the process _exits (status 137, as a SIGKILL'd one
 *                              reports) at its (N+1)th communication call
 *                              (AllGather, AllReduce, Broadcast, Send, Recv; counted
 *                              per call and communicator): a rank killed mid-way
 *   FAKE_NCCL_HANG_AFTER=N     the (N+1)th communication call never returns, its
 *                              sockets left open (a rank stuck in a kernel: its
 *                              peers wait in theirs, as with NCCL, until aborted,
 *                              killed or FAKE_NCCL_OP_TIMEOUT_MS)
 *   FAKE_NCCL_KILL_POD_AFTER=N at the (N+1)th communication call the process SIGKILLs its
 *                              parent (the pod's nccl-preflight) and _exits (137): a pod
 *                              killed mid-measurement, its connections closed at once
 *   FAKE_NCCL_FREEZE_POD_AFTER=N  at the (N+1)th communication call a helper stops (SIGSTOP)
 *                              this process and its parent for FAKE_NCCL_FREEZE_MS (default
 *                              8000) ms, then continues them: a pod that stops answering,
 *                              its sockets open (a node that hangs, a partitioned network)
 *   FAKE_NCCL_POISON=V         what this rank contributes to every ncclAllGather whose
 *                              data is doubles is replaced with V (nan, inf, -inf, -1): a
 *                              peer that sends numbers no run gives
 *   FAKE_NCCL_HANG_INIT=1      init never contacts the root and never completes
 *                              (only ncclCommAbort ends it): a rank that never joins
 *   FAKE_NCCL_INIT_TIMEOUT_MS  bound on the whole init (default: none, as NCCL)
 *   FAKE_NCCL_OP_TIMEOUT_MS    bound on one operation (default: none, as NCCL)
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* ---- ABI ---------------------------------------------------------------- */

typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
    ncclNumResults = 8
} ncclResult_t;

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct { char internal[NCCL_UNIQUE_ID_BYTES]; } ncclUniqueId;

#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_MAGIC 0xcafebeef
/* The 2.28 layout (ncclConfig_v22800); older callers pass a smaller `size`. */
typedef struct {
    size_t size;
    unsigned int magic;
    unsigned int version;
    int blocking;
    int cgaClusterSize;
    int minCTAs;
    int maxCTAs;
    const char *netName;
    int splitShare;
    int trafficClass;
    const char *commName;
    int collnetEnable;
    int CTAPolicy;
    int shrinkShare;
    int nvlsCTAs;
    int nChannelsPerNetPeer;
    int nvlinkCentricSched;
} ncclConfig_t;

typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 } ncclRedOp_t;
typedef enum {
    ncclInt8 = 0, ncclUint8 = 1, ncclInt32 = 2, ncclUint32 = 3, ncclInt64 = 4,
    ncclUint64 = 5, ncclFloat16 = 6, ncclFloat32 = 7, ncclFloat64 = 8,
    ncclBfloat16 = 9, ncclFloat8e4m3 = 10, ncclFloat8e5m2 = 11
} ncclDataType_t;
typedef void *cudaStream_t;
typedef struct ncclComm *ncclComm_t;

/* The layouts callers compile against (nccl.h on x86_64 and aarch64). */
_Static_assert(sizeof(ncclUniqueId) == 128, "ncclUniqueId is 128 bytes");
_Static_assert(offsetof(ncclConfig_t, blocking) == 16, "ncclConfig_t: size, magic, version, then blocking");
_Static_assert(offsetof(ncclConfig_t, netName) == 32, "ncclConfig_t v21700 fields");
_Static_assert(offsetof(ncclConfig_t, splitShare) == 40, "ncclConfig_t v21700 fields");
_Static_assert(sizeof(ncclConfig_t) == 80, "ncclConfig_t v22800 is 80 bytes");
_Static_assert(sizeof(ncclResult_t) == 4 && sizeof(ncclDataType_t) == 4 && sizeof(ncclRedOp_t) == 4, "enums are ints");

/* NCCL_MAGIC, src/include/comm.h: "Nickel atomic number is 28". */
#define NCCL_MAGIC 0x0280028002800280ULL
/* Tags the fake's own messages (bootstrap and data headers). */
#define WIRE_MAGIC 0x4e43434cU /* "NCCL" */
#define SLICE_MS 100

/* ---- logging ------------------------------------------------------------ */

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static FILE *log_file;
static int log_level; /* 0 none, 1 WARN, 2 INFO */
static char host_name[64];
static char last_error[1024];

static void log_setup(void) {
    gethostname(host_name, sizeof host_name - 1);
    char *dot = strchr(host_name, '.');
    if (dot) *dot = 0;
    const char *level = getenv("NCCL_DEBUG");
    if (level && (!strcasecmp(level, "INFO") || !strcasecmp(level, "TRACE"))) log_level = 2;
    else if (level && !strcasecmp(level, "WARN")) log_level = 1;
    log_file = stderr;
    const char *file = getenv("NCCL_DEBUG_FILE");
    if (log_level && file && *file) {
        /* src/debug.cc: %h is the host name, %p the pid. */
        char path[4096];
        size_t o = 0;
        for (const char *c = file; *c && o + 80 < sizeof path; c++) {
            if (c[0] == '%' && c[1] == 'h') { o += snprintf(path + o, sizeof path - o, "%s", host_name); c++; }
            else if (c[0] == '%' && c[1] == 'p') { o += snprintf(path + o, sizeof path - o, "%d", (int)getpid()); c++; }
            else path[o++] = *c;
        }
        path[o] = 0;
        FILE *f = fopen(path, "w");
        if (f) { setvbuf(f, NULL, _IOLBF, 0); log_file = f; }
    }
}

/* One NCCL-format line: "host:pid:tid [dev] NCCL INFO msg", or for WARN
 * "host:pid:tid [dev] file:line NCCL WARN msg" (src/debug.cc). */
static void vlog(int level, int dev, int line, const char *fmt, va_list ap) {
    pthread_once(&log_once, log_setup);
    char msg[1024];
    vsnprintf(msg, sizeof msg, fmt, ap);
    pthread_mutex_lock(&log_lock);
    if (level == 1) snprintf(last_error, sizeof last_error, "%s", msg);
    if (level <= log_level) {
        int tid = (int)syscall(SYS_gettid);
        if (level == 1)
            fprintf(log_file, "%s:%d:%d [%d] fake_nccl_gang.c:%d NCCL WARN %s\n", host_name, (int)getpid(), tid, dev, line, msg);
        else
            fprintf(log_file, "%s:%d:%d [%d] NCCL INFO %s\n", host_name, (int)getpid(), tid, dev, msg);
        fflush(log_file);
    }
    pthread_mutex_unlock(&log_lock);
}
static void log_at(int level, int dev, int line, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void log_at(int level, int dev, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vlog(level, dev, line, fmt, ap);
    va_end(ap);
}
#define WARN(dev, ...) log_at(1, dev, __LINE__, __VA_ARGS__)
#define INFO(dev, ...) log_at(2, dev, __LINE__, __VA_ARGS__)

/* ---- knobs -------------------------------------------------------------- */

static long env_long(const char *name, long fallback) {
    const char *v = getenv(name);
    if (!v || !*v) return fallback;
    char *end;
    long n = strtol(v, &end, 10);
    return *end ? fallback : n;
}

static int fake_version(void) { return (int)env_long("FAKE_NCCL_VERSION", 22809); }

static uint64_t now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
}

/* ---- communicators ------------------------------------------------------ */

enum opkind { OP_ALLGATHER, OP_ALLREDUCE, OP_BCAST, OP_SEND, OP_RECV };
static const char *op_names[] = {"AllGather", "AllReduce", "Broadcast", "Send", "Recv"};

struct op {
    enum opkind kind;
    const void *sbuf;
    void *rbuf;
    size_t count;
    int dtype, redop, peer; /* peer: the other rank (send/recv) or the root (broadcast) */
    struct op *next;
};

/* What a rank tells the root, and the root tells everyone: one per rank. */
struct hello {
    uint32_t magic;
    uint64_t id_magic;            /* the unique id's magic: the root accepts only its own */
    int32_t rank, nranks, version, dev;
    struct sockaddr_storage addr; /* where this rank accepts its peers */
    char host[64];                /* NCCL_HOSTID, else the host name: what counts as a node */
};

struct ncclComm {
    int rank, nranks, dev, blocking;
    ncclUniqueId id;
    atomic_int abort_flag;
    atomic_int state; /* ncclResult_t: ncclInProgress until init ends */
    atomic_int busy;  /* threads running its operations */
    int init_queued;  /* waiting for ncclGroupEnd */
    int thread_started;
    pthread_t thread;
    int *fds; /* per peer, -1 for self */
    int *devs;
    int listen_fd;
    uint64_t init_deadline;
    struct op *ops, *ops_tail;
};

static pthread_mutex_t dev_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t devs_in_use;

static int take_device(void) {
    pthread_mutex_lock(&dev_lock);
    int d = 0;
    while (d < 63 && (devs_in_use >> d) & 1) d++;
    devs_in_use |= 1ULL << d;
    pthread_mutex_unlock(&dev_lock);
    return d;
}
static void give_device(int d) {
    pthread_mutex_lock(&dev_lock);
    devs_in_use &= ~(1ULL << d);
    pthread_mutex_unlock(&dev_lock);
}

/* Why a wait ended early: abort (ncclInternalError, the comm is going away),
 * the init backstop (ncclRemoteError), or 0 to keep waiting. */
static ncclResult_t interrupted(struct ncclComm *c, uint64_t deadline, const char *waiting_for) {
    if (atomic_load(&c->abort_flag)) return ncclInternalError;
    if (deadline && now_ms() >= deadline) {
        WARN(c->dev, "fake libnccl: rank %d timed out waiting for %s", c->rank, waiting_for);
        return ncclRemoteError;
    }
    return ncclSuccess;
}

static void sleep_ms(unsigned ms) {
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

static const char *addr_text(const struct sockaddr_storage *a, char *out, size_t n) {
    char ip[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (a->ss_family == AF_INET) {
        const struct sockaddr_in *s = (const void *)a;
        inet_ntop(AF_INET, &s->sin_addr, ip, sizeof ip);
        port = ntohs(s->sin_port);
    } else if (a->ss_family == AF_INET6) {
        const struct sockaddr_in6 *s = (const void *)a;
        inet_ntop(AF_INET6, &s->sin6_addr, ip, sizeof ip);
        port = ntohs(s->sin6_port);
    }
    /* NCCL writes addresses as ip<port> (src/misc/socket.cc ncclSocketToString). */
    snprintf(out, n, "%s<%d>", ip, port);
    return out;
}

/* The interface holding `addr`, for NCCL's "Using eth0:10.0.0.1<0>" lines. */
static void interface_of(const struct sockaddr_storage *addr, char *out, size_t n) {
    struct ifaddrs *all, *i;
    snprintf(out, n, "?");
    if (getifaddrs(&all)) return;
    for (i = all; i; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != addr->ss_family) continue;
        int same = addr->ss_family == AF_INET
                       ? !memcmp(&((struct sockaddr_in *)i->ifa_addr)->sin_addr, &((const struct sockaddr_in *)addr)->sin_addr, 4)
                       : !memcmp(&((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr, &((const struct sockaddr_in6 *)addr)->sin6_addr, 16);
        if (same) { snprintf(out, n, "%s", i->ifa_name); break; }
    }
    freeifaddrs(all);
}

static socklen_t addr_len(const struct sockaddr_storage *a) {
    return a->ss_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
}


/* Waits for `events` on fd in slices, so abort and the deadline are noticed. */
static ncclResult_t wait_fd(struct ncclComm *c, int fd, short events, uint64_t deadline, const char *what) {
    for (;;) {
        ncclResult_t r = interrupted(c, deadline, what);
        if (r) return r;
        struct pollfd p = {fd, events, 0};
        int n = poll(&p, 1, SLICE_MS);
        if (n > 0) return ncclSuccess;
        if (n < 0 && errno != EINTR) {
            WARN(c->dev, "fake libnccl: poll: %s", strerror(errno));
            return ncclSystemError;
        }
    }
}

/* Sends or receives exactly len bytes on a non-blocking socket (bootstrap only). */
static ncclResult_t io_all(struct ncclComm *c, int fd, void *buf, size_t len, int sending, uint64_t deadline, const char *what) {
    size_t done = 0;
    while (done < len) {
        ncclResult_t r = wait_fd(c, fd, sending ? POLLOUT : POLLIN, deadline, what);
        if (r) return r;
        ssize_t n = sending ? send(fd, (char *)buf + done, len - done, MSG_NOSIGNAL)
                            : recv(fd, (char *)buf + done, len - done, 0);
        if (n > 0) { done += (size_t)n; continue; }
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        WARN(c->dev, "fake libnccl: rank %d: %s: %s", c->rank, what, n == 0 ? "connection closed by remote peer" : strerror(errno));
        return ncclRemoteError;
    }
    return ncclSuccess;
}

/* Connects like NCCL's ncclSocketConnect: refused or unreachable attempts are
 * retried NCCL_SOCKET_RETRY_CNT times, sleeping n * NCCL_SOCKET_RETRY_SLEEP_MSEC
 * ms before attempt n+1 (src/misc/socket.cc socketConnectCheck). */
static ncclResult_t connect_to(struct ncclComm *c, const struct sockaddr_storage *to, uint64_t deadline, int *out) {
    long retries = env_long("NCCL_SOCKET_RETRY_CNT", 34), sleep_each = env_long("NCCL_SOCKET_RETRY_SLEEP_MSEC", 100);
    char text[96];
    for (long attempt = 0;; attempt++) {
        ncclResult_t r = interrupted(c, deadline, "a connection");
        if (r) return r;
        int fd = socket(to->ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) { WARN(c->dev, "fake libnccl: socket: %s", strerror(errno)); return ncclSystemError; }
        int err = 0;
        if (connect(fd, (const struct sockaddr *)to, addr_len(to)) < 0) err = errno;
        if (err == EINPROGRESS) {
            r = wait_fd(c, fd, POLLOUT, deadline, "a connection");
            if (r) { close(fd); return r; }
            socklen_t l = sizeof err;
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &l);
        }
        if (!err) {
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            *out = fd;
            return ncclSuccess;
        }
        close(fd);
        if (err != ECONNREFUSED && err != ETIMEDOUT && err != EHOSTUNREACH && err != ENETUNREACH && err != EAGAIN) {
            WARN(c->dev, "fake libnccl: connect to %s failed : %s", addr_text(to, text, sizeof text), strerror(err));
            return ncclSystemError;
        }
        if (attempt >= retries) {
            WARN(c->dev, "fake libnccl: connect to %s returned %s, exceeded error retry count after %ld attempts",
                 addr_text(to, text, sizeof text), strerror(err), attempt + 1);
            return ncclRemoteError;
        }
        INFO(c->dev, "fake libnccl: connect to %s returned %s, retrying (%ld/%ld) after sleep for %ld msec",
             addr_text(to, text, sizeof text), strerror(err), attempt + 1, retries, (attempt + 1) * sleep_each);
        for (long slept = 0; slept < (attempt + 1) * sleep_each; slept += 20) {
            if ((r = interrupted(c, deadline, "a connection"))) return r;
            sleep_ms(20);
        }
    }
}

static ncclResult_t accept_one(struct ncclComm *c, int lfd, uint64_t deadline, const char *what, int *out) {
    for (;;) {
        ncclResult_t r = wait_fd(c, lfd, POLLIN, deadline, what);
        if (r) return r;
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd >= 0) {
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            *out = fd;
            return ncclSuccess;
        }
        if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED) {
            WARN(c->dev, "fake libnccl: accept: %s", strerror(errno));
            return ncclSystemError;
        }
    }
}

static ncclResult_t listen_at(struct ncclComm *c, struct sockaddr_storage *addr, int backlog, int *out) {
    char text[96];
    int fd = socket(addr->ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) { WARN(c->dev, "fake libnccl: socket: %s", strerror(errno)); return ncclSystemError; }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)addr, addr_len(addr)) < 0 || listen(fd, backlog) < 0) {
        WARN(c->dev, "fake libnccl: listen at %s: %s", addr_text(addr, text, sizeof text), strerror(errno));
        close(fd);
        return ncclSystemError;
    }
    socklen_t l = sizeof *addr;
    getsockname(fd, (struct sockaddr *)addr, &l);
    *out = fd;
    return ncclSuccess;
}

/* The bootstrap root, run by rank 0's init: collects every rank's hello and
 * sends the whole table back (NCCL's bootstrapRoot does the same with ring
 * neighbours). Waits without limit, as NCCL does, unless aborted. */
static ncclResult_t run_root(struct ncclComm *c, int root_fd, struct hello *table) {
    int n = c->nranks, *fds = calloc((size_t)n, sizeof *fds);
    char *seen = calloc((size_t)n, 1);
    ncclResult_t r = ncclSuccess;
    if (!fds || !seen) { free(fds); free(seen); return ncclSystemError; }
    for (int i = 0; i < n; i++) fds[i] = -1;
    seen[0] = 1; /* rank 0's own hello is already in table[0] */
    for (int got = 1; got < n && !r; got++) {
        int fd;
        struct hello h;
        if ((r = accept_one(c, root_fd, c->init_deadline, "all ranks to join the bootstrap root", &fd))) break;
        /* The wire magic first, as NCCL reads its socket magic before anything else
         * and drops a connection that carries another (src/misc/socket.cc
         * socketFinalizeAccept): a stranger on the port is closed, the root goes on. */
        if ((r = io_all(c, fd, &h.magic, sizeof h.magic, 0, c->init_deadline, "a rank's bootstrap hello"))) { close(fd); break; }
        if (h.magic != WIRE_MAGIC) {
            INFO(c->dev, "fake libnccl: bootstrap root: dropped a connection with wire magic 0x%x", h.magic);
            close(fd);
            got--;
            continue;
        }
        if ((r = io_all(c, fd, (char *)&h + sizeof h.magic, sizeof h - sizeof h.magic, 0, c->init_deadline, "a rank's bootstrap hello"))) { close(fd); break; }
        /* NCCL's root drops a connection whose magic is not the handle's and accepts
         * again, silently in 2.28 (src/misc/socket.cc socketFinalizeAccept). */
        uint64_t want;
        memcpy(&want, c->id.internal, 8);
        if (h.magic == WIRE_MAGIC && h.id_magic != want) {
            INFO(c->dev, "fake libnccl: bootstrap root: dropped a connection with magic 0x%llx", (unsigned long long)h.id_magic);
            close(fd);
            got--;
            continue;
        }
        if (h.magic != WIRE_MAGIC || h.nranks != n || h.rank <= 0 || h.rank >= n || seen[h.rank]) {
            WARN(c->dev, "fake libnccl: bootstrap root: a rank registered as rank %d of %d; expected a new rank of %d",
                 h.rank, h.nranks, n);
            close(fd);
            r = ncclInvalidUsage;
            break;
        }
        h.host[sizeof h.host - 1] = 0;
        seen[h.rank] = 1;
        fds[h.rank] = fd;
        table[h.rank] = h;
    }
    for (int i = 1; i < n; i++) {
        if (fds[i] < 0) continue;
        if (!r) r = io_all(c, fds[i], table, sizeof *table * (size_t)n, 1, c->init_deadline, "sending the rank table");
        close(fds[i]);
    }
    free(fds);
    free(seen);
    return r;
}

static ncclResult_t bootstrap(struct ncclComm *c) {
    int n = c->nranks;
    struct sockaddr_storage root;
    memcpy(&root, c->id.internal + 8, sizeof root);
    struct hello *table = calloc((size_t)n, sizeof *table);
    if (!table) return ncclSystemError;
    struct hello me = {WIRE_MAGIC, 0, c->rank, n, fake_version(), c->dev, {0}, {0}};
    memcpy(&me.id_magic, c->id.internal, 8);
    /* NCCL's host hash comes from NCCL_HOSTID when set, else the host name and boot id (misc/utils.cc getHostHash). */
    const char *hostid = getenv("NCCL_HOSTID");
    pthread_once(&log_once, log_setup);
    snprintf(me.host, sizeof me.host, "%s", hostid && *hostid ? hostid : host_name);
    ncclResult_t r = ncclSuccess;
    int root_fd = -1;
    char text[96];

    if (c->rank == 0) {
        /* "start the bootstrap root before bootstrapping" (init.cc): at the NCCL_COMM_ID address. */
        struct sockaddr_storage at = root;
        if ((r = listen_at(c, &at, 1024, &root_fd))) goto out;
        me.addr = root;
        ((struct sockaddr_in *)&me.addr)->sin_port = 0; /* same offset for in and in6 */
        if ((r = listen_at(c, &me.addr, 1024, &c->listen_fd))) goto out;
        table[0] = me;
        INFO(c->dev, "fake libnccl: bootstrap root listening at %s", addr_text(&at, text, sizeof text));
        if ((r = run_root(c, root_fd, table))) goto out;
    } else {
        if ((r = connect_to(c, &root, c->init_deadline, &root_fd))) goto out;
        /* Listen on the interface that reaches the root, as bootstrapNetInit picks
         * the interface in the NCCL_COMM_ID subnet. */
        socklen_t l = sizeof me.addr;
        getsockname(root_fd, (struct sockaddr *)&me.addr, &l);
        ((struct sockaddr_in *)&me.addr)->sin_port = 0;
        if ((r = listen_at(c, &me.addr, 1024, &c->listen_fd))) goto out;
        /* FAKE_NCCL_MISMATCH_HANG=1: this rank's bootstrap message is shorter, as
         * another NCCL version's can be: the root waits for the rest, so no rank's
         * join completes (what 4 pods with one on NCCL 2.28.3 among 2.28.9 did on
         * real NCCL: every rank timed out instead of "Mismatched NCCL version"). */
        size_t hello_len = env_long("FAKE_NCCL_MISMATCH_HANG", 0) ? sizeof me - 16 : sizeof me;
        if ((r = io_all(c, root_fd, &me, hello_len, 1, c->init_deadline, "registering with the bootstrap root"))) goto out;
        if ((r = io_all(c, root_fd, table, sizeof *table * (size_t)n, 0, c->init_deadline, "the rank table from the bootstrap root"))) goto out;
        for (int i = 0; i < n; i++) table[i].host[sizeof table[i].host - 1] = 0;
    }
    /* init.cc after AllGather1: every rank must run the same NCCL version. */
    for (int i = 0; i < n; i++) {
        if (table[i].version != table[c->rank].version) {
            WARN(c->dev, "Mismatched NCCL version detected : rank %d version %d rank %d version %d",
                 i, table[i].version, c->rank, table[c->rank].version);
            r = ncclInvalidUsage;
            goto out;
        }
    }
    for (int i = 0; i < n; i++) c->devs[i] = table[i].dev;
    /* The mesh: connect to every lower rank, accept every higher one. */
    for (int j = 0; j < c->rank; j++) {
        uint32_t who[2] = {WIRE_MAGIC, (uint32_t)c->rank};
        if ((r = connect_to(c, &table[j].addr, c->init_deadline, &c->fds[j]))) goto out;
        if ((r = io_all(c, c->fds[j], who, sizeof who, 1, c->init_deadline, "introducing itself to a peer"))) goto out;
    }
    for (int k = c->rank + 1; k < n; k++) {
        int fd;
        uint32_t who[2];
        if ((r = accept_one(c, c->listen_fd, c->init_deadline, "peers to connect", &fd))) goto out;
        if ((r = io_all(c, fd, who, sizeof who, 0, c->init_deadline, "a peer's introduction"))) { close(fd); goto out; }
        if (who[0] != WIRE_MAGIC || (int)who[1] <= c->rank || (int)who[1] >= n || c->fds[who[1]] >= 0) {
            WARN(c->dev, "fake libnccl: rank %d: unexpected peer introduction (rank %u)", c->rank, who[1]);
            close(fd);
            r = ncclInvalidUsage;
            goto out;
        }
        c->fds[who[1]] = fd;
    }
    const char *transport = getenv("FAKE_NCCL_TRANSPORT");
    if (!transport || !*transport) transport = "NET/Socket/0";
    char net[32] = "", ifname[64], ip[96];
    if (!strncmp(transport, "NET/", 4)) sscanf(transport + 4, "%31[^/]", net);
    interface_of(&table[c->rank].addr, ifname, sizeof ifname);
    addr_text(&table[c->rank].addr, ip, sizeof ip);
    char *port = strchr(ip, '<');
    if (port) snprintf(port, sizeof ip - (size_t)(port - ip), "<0>");
    INFO(c->dev, "Bootstrap: Using %s:%s", ifname, ip);
    if (!strcmp(net, "Socket")) INFO(c->dev, "NET/Socket : Using [0]%s:%s", ifname, ip);
    if (*net) INFO(c->dev, "Using network %s", net);
    int nodes = 0, local_ranks = 0, local_rank = 0;
    for (int i = 0; i < n; i++) {
        int first = 1;
        for (int j = 0; j < i; j++) first &= strcmp(table[i].host, table[j].host) != 0;
        nodes += first;
        if (!strcmp(table[i].host, me.host)) { local_rank += i < c->rank; local_ranks++; }
    }
    INFO(c->dev, "comm %p rank %d nRanks %d nNodes %d localRanks %d localRank %d MNNVL 0", (void *)c, c->rank, n, nodes,
         local_ranks, local_rank);
    for (int p = 0; p < n; p++) {
        if (p == c->rank) continue;
        INFO(c->dev, "Channel 00/0 : %d[%d] -> %d[%d] [send] via %s", c->rank, c->dev, p, c->devs[p], transport);
        INFO(c->dev, "Channel 00/0 : %d[%d] -> %d[%d] [receive] via %s", p, c->devs[p], c->rank, c->dev, transport);
    }
    INFO(c->dev, "comm %p rank %d nranks %d cudaDev %d - Init COMPLETE", (void *)c, c->rank, n, c->dev);
out:
    if (root_fd >= 0) close(root_fd);
    if (c->listen_fd >= 0) { close(c->listen_fd); c->listen_fd = -1; }
    free(table);
    return r;
}

/* NCCL's bootstrapNetInit (src/bootstrap.cc), once per process with its result
 * cached: with NCCL_COMM_ID set, the bootstrap interface must hold an address in
 * the same subnet (by the local netmask, src/misc/socket.cc matchSubnet) as
 * NCCL_COMM_ID's; with none, every NCCL call fails. So a non-root rank on a pod
 * network (/32 or per-node /24) given NCCL_COMM_ID fails here, as with NCCL. */
static int parse_comm_id(const char *env, struct sockaddr_storage *addr);
static pthread_once_t net_once = PTHREAD_ONCE_INIT;
static ncclResult_t net_result;
static void net_init(void) {
    const char *env = getenv("NCCL_COMM_ID");
    if (!env || !*env) return;
    struct sockaddr_storage remote;
    if (parse_comm_id(env, &remote)) {
        WARN(0, "Invalid NCCL_COMM_ID, please use format: <ipv4>:<port> or [<ipv6>]:<port> or <hostname>:<port>");
        net_result = ncclInvalidArgument;
        return;
    }
    struct ifaddrs *all, *i;
    int found = 0;
    if (getifaddrs(&all)) { net_result = ncclSystemError; return; }
    for (i = all; i && !found; i = i->ifa_next) {
        if (!i->ifa_addr || !i->ifa_netmask || i->ifa_addr->sa_family != remote.ss_family) continue;
        if (remote.ss_family == AF_INET) {
            uint32_t l = ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr, m = ((struct sockaddr_in *)i->ifa_netmask)->sin_addr.s_addr;
            found = (l & m) == (((struct sockaddr_in *)&remote)->sin_addr.s_addr & m);
        } else {
            const unsigned char *l = ((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr.s6_addr, *m = ((struct sockaddr_in6 *)i->ifa_netmask)->sin6_addr.s6_addr,
                                *r = ((struct sockaddr_in6 *)&remote)->sin6_addr.s6_addr;
            found = 1;
            for (int k = 0; k < 16; k++) found &= (l[k] & m[k]) == (r[k] & m[k]);
        }
    }
    freeifaddrs(all);
    if (!found) {
        WARN(0, "NET/Socket : No usable listening interface found");
        net_result = ncclSystemError;
    }
}

static ncclResult_t do_init(struct ncclComm *c) {
    pthread_once(&net_once, net_init);
    if (net_result) return net_result;
    long limit = env_long("FAKE_NCCL_INIT_TIMEOUT_MS", 0);
    c->init_deadline = limit > 0 ? now_ms() + (uint64_t)limit : 0;
    if (env_long("FAKE_NCCL_HANG_INIT", 0) == 1) {
        INFO(c->dev, "fake libnccl: FAKE_NCCL_HANG_INIT: rank %d never joins", c->rank);
        ncclResult_t r;
        while (!(r = interrupted(c, c->init_deadline, "FAKE_NCCL_HANG_INIT"))) sleep_ms(SLICE_MS);
        return r;
    }
    return bootstrap(c);
}

static void *init_thread(void *arg) {
    struct ncclComm *c = arg;
    atomic_store(&c->state, do_init(c));
    return NULL;
}

static void close_comm(struct ncclComm *c) {
    for (int i = 0; c->fds && i < c->nranks; i++)
        if (c->fds[i] >= 0) close(c->fds[i]);
    if (c->listen_fd >= 0) close(c->listen_fd);
    for (struct op *o = c->ops, *next; o; o = next) { next = o->next; free(o); }
    give_device(c->dev);
    free(c->fds);
    free(c->devs);
    free(c);
}

/* ---- groups (per thread, as NCCL's) --------------------------------------- */

static __thread int group_depth;
static __thread struct ncclComm **group_comms;
static __thread int group_n, group_cap;

static int group_add(struct ncclComm *c) {
    for (int i = 0; i < group_n; i++)
        if (group_comms[i] == c) return 0;
    if (group_n == group_cap) {
        int cap = group_cap ? group_cap * 2 : 8;
        struct ncclComm **g = realloc(group_comms, sizeof *g * (size_t)cap);
        if (!g) return -1;
        group_comms = g;
        group_cap = cap;
    }
    group_comms[group_n++] = c;
    return 0;
}

/* A communicator freed inside a group leaves it (its queued init or operations die with it). */
static void group_remove(struct ncclComm *c) {
    for (int i = 0; i < group_n; i++)
        if (group_comms[i] == c) group_comms[i] = group_comms[--group_n];
}

/* ---- public calls: basics ------------------------------------------------- */

ncclResult_t ncclGetVersion(int *version) {
    if (!version) return ncclInvalidArgument;
    *version = fake_version();
    return ncclSuccess;
}

/* The strings of src/misc/utils.cc ncclGetErrorString. */
const char *ncclGetErrorString(ncclResult_t code) {
    switch (code) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

const char *ncclGetLastError(ncclComm_t comm) {
    (void)comm;
    return last_error;
}

/* <ipv4>:<port>, [<ipv6>]:<port> or <hostname>:<port> (src/misc/socket.cc
 * ncclSocketGetAddrFromString); 0 on success. */
static int parse_comm_id(const char *env, struct sockaddr_storage *addr) {
    char host[256];
    const char *colon = strrchr(env, ':');
    size_t hl = colon ? (size_t)(colon - env) : 0;
    if (hl && env[0] == '[' && env[hl - 1] == ']') { env++; hl -= 2; }
    char *end = NULL;
    long port = colon ? strtol(colon + 1, &end, 10) : 0;
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_socktype = SOCK_STREAM;
    if (!colon || !hl || hl >= sizeof host || !end || *end || port <= 0 || port > 65535) return -1;
    memcpy(host, env, hl);
    host[hl] = 0;
    if (getaddrinfo(host, NULL, &hints, &res) || !res) return -1;
    memset(addr, 0, sizeof *addr);
    memcpy(addr, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    ((struct sockaddr_in *)addr)->sin_port = htons((uint16_t)port);
    return 0;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    if (!id) return ncclInvalidArgument;
    pthread_once(&log_once, log_setup);
    memset(id, 0, sizeof *id);
    const char *env = getenv("NCCL_COMM_ID");
    if (!env || !*env) {
        WARN(0, "fake libnccl: ncclGetUniqueId needs NCCL_COMM_ID=<host>:<port> (this fake starts no root of its own)");
        return ncclInvalidUsage;
    }
    INFO(0, "NCCL_COMM_ID set by environment to %s", env);
    struct sockaddr_storage addr;
    if (parse_comm_id(env, &addr)) {
        WARN(0, "Invalid NCCL_COMM_ID, please use format: <ipv4>:<port> or [<ipv6>]:<port> or <hostname>:<port>");
        return ncclInvalidArgument;
    }
    uint64_t magic = NCCL_MAGIC;
    memcpy(id->internal, &magic, 8);
    /* A sockaddr_in6 (28 bytes) fits; NCCL's handle is {magic, union ncclSocketAddress}. */
    memcpy(id->internal + 8, &addr, sizeof(struct sockaddr_in6));
    return ncclSuccess;
}

/* NCCL's first INFO line (init.cc showVersion). */
static void print_version(void) {
    int v = fake_version();
    int major = v >= 10000 ? v / 10000 : v / 1000, minor = v >= 10000 ? v / 100 % 100 : v / 100 % 10, patch = v % 100;
    const char *cuda = getenv("FAKE_NCCL_CUDA");
    INFO(0, "NCCL version %d.%d.%d+cuda%s", major, minor, patch, cuda && *cuda ? cuda : "12.8");
}

/* FAKE_NCCL_DIAG_FILE's NCCL DIAG lines, re-prefixed with this process. */
static void print_diagnostics(void) {
    const char *path = getenv("FAKE_NCCL_DIAG_FILE");
    const char *run = getenv("NCCL_RUN_RAS_DIAGNOSTICS");
    if (!path || !run || strcmp(run, "1") || fake_version() < 23100) return;
    FILE *f = fopen(path, "r");
    if (!f) return;
    char line[2048];
    pthread_mutex_lock(&log_lock);
    while (fgets(line, sizeof line, f)) {
        const char *body = strstr(line, "NCCL DIAG ");
        if (body) fprintf(log_file, "%s:%d %s", host_name, (int)getpid(), body);
    }
    fflush(log_file);
    pthread_mutex_unlock(&log_lock);
    fclose(f);
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *out, int nranks, ncclUniqueId id, int rank, ncclConfig_t *config) {
    pthread_once(&log_once, log_setup);
    if (!out) return ncclInvalidArgument;
    *out = NULL;
    if (nranks < 1 || rank < 0 || rank >= nranks) {
        WARN(0, "Invalid rank requested : %d/%d", rank, nranks);
        return ncclInvalidArgument;
    }
    /* NCCL takes any magic the ranks agree on (src/bootstrap.cc: the root listens with
     * the handle's, every rank connects with BOOTSTRAP_HANDLE(handles,0)->magic); a zero
     * one here means an id nobody built. */
    uint64_t magic;
    memcpy(&magic, id.internal, 8);
    if (magic == 0) {
        WARN(0, "fake libnccl: the unique id carries no magic (not from ncclGetUniqueId or a handle built like it)");
        return ncclInvalidArgument;
    }
    /* init.cc parseCommConfig: copy at most the caller's size, then check the magic. */
    ncclConfig_t cfg = {0};
    cfg.blocking = NCCL_CONFIG_UNDEF_INT;
    if (config) {
        size_t size;
        memcpy(&size, config, sizeof size);
        if (size > sizeof cfg) size = sizeof cfg;
        memcpy(&cfg, config, size);
        if (cfg.magic != NCCL_CONFIG_MAGIC) {
            WARN(0, "ncclConfig_t argument not initialized via NCCL_CONFIG_INITIALIZER");
            return ncclInvalidArgument;
        }
        if (cfg.blocking != NCCL_CONFIG_UNDEF_INT && cfg.blocking != 0 && cfg.blocking != 1) {
            WARN(0, "Invalid config blocking attribute value %d", cfg.blocking);
            return ncclInvalidArgument;
        }
    }
    /* Unset: NCCL_COMM_BLOCKING, else blocking (init.cc envConfigOverride). */
    int blocking = cfg.blocking != NCCL_CONFIG_UNDEF_INT ? cfg.blocking : env_long("NCCL_COMM_BLOCKING", 1) != 0;
    struct ncclComm *c = calloc(1, sizeof *c);
    if (!c) return ncclSystemError;
    c->fds = malloc(sizeof *c->fds * (size_t)nranks);
    c->devs = calloc((size_t)nranks, sizeof *c->devs);
    if (!c->fds || !c->devs) { free(c->fds); free(c->devs); free(c); return ncclSystemError; }
    for (int i = 0; i < nranks; i++) c->fds[i] = -1;
    c->rank = rank;
    c->nranks = nranks;
    c->blocking = blocking;
    c->id = id;
    c->listen_fd = -1;
    c->dev = take_device();
    atomic_store(&c->state, ncclInProgress);
    static pthread_once_t version_once = PTHREAD_ONCE_INIT;
    pthread_once(&version_once, print_version);
    /* init.cc's line, without busId (no PCI device here); commId hashes the unique id, so every rank prints the same. */
    uint64_t comm_id = 1469598103934665603ULL;
    for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) comm_id = (comm_id ^ (unsigned char)id.internal[i]) * 1099511628211ULL;
    INFO(c->dev, "ncclCommInitRankConfig comm %p rank %d nranks %d cudaDev %d nvmlDev %d commId 0x%llx - Init START", (void *)c,
         rank, nranks, c->dev, c->dev, (unsigned long long)comm_id);
    if (rank == 0) print_diagnostics();
    *out = c;
    if (group_depth > 0) {
        if (group_add(c)) { *out = NULL; close_comm(c); return ncclSystemError; }
        c->init_queued = 1;
        return ncclSuccess;
    }
    if (!blocking) {
        if (pthread_create(&c->thread, NULL, init_thread, c)) { *out = NULL; close_comm(c); return ncclSystemError; }
        c->thread_started = 1;
        return ncclInProgress;
    }
    ncclResult_t r = do_init(c);
    if (r) { *out = NULL; close_comm(c); return r; }
    atomic_store(&c->state, ncclSuccess);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    return ncclCommInitRankConfig(comm, nranks, id, rank, NULL);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *error) {
    if (!comm || !error) return ncclInvalidArgument;
    *error = (ncclResult_t)atomic_load(&comm->state);
    return ncclSuccess;
}

/* Interrupts whatever the communicator is waiting for (init, an operation on
 * another thread) and frees it. */
ncclResult_t ncclCommAbort(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    atomic_store(&comm->abort_flag, 1);
    if (comm->thread_started) pthread_join(comm->thread, NULL);
    /* An operation on another thread sees the flag within a poll slice. */
    while (atomic_load(&comm->busy)) sleep_ms(5);
    group_remove(comm);
    INFO(comm->dev, "comm %p rank %d nranks %d - Abort COMPLETE", (void *)comm, comm->rank, comm->nranks);
    close_comm(comm);
    return ncclSuccess;
}

/* Operations are synchronous, so there is nothing left to flush. */
ncclResult_t ncclCommFinalize(ncclComm_t comm) { return comm ? ncclSuccess : ncclInvalidArgument; }

/* A communicator whose init is still pending is interrupted first (NCCL
 * expects the caller to have waited; here destroying one must not hang). */
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    if (comm->thread_started && atomic_load(&comm->state) == ncclInProgress) atomic_store(&comm->abort_flag, 1);
    if (comm->thread_started) pthread_join(comm->thread, NULL);
    group_remove(comm);
    INFO(comm->dev, "comm %p rank %d nranks %d - Destroy COMPLETE", (void *)comm, comm->rank, comm->nranks);
    close_comm(comm);
    return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
    if (!comm || !count) return ncclInvalidArgument;
    *count = comm->nranks;
    return ncclSuccess;
}
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
    if (!comm || !rank) return ncclInvalidArgument;
    *rank = comm->rank;
    return ncclSuccess;
}
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device) {
    if (!comm || !device) return ncclInvalidArgument;
    *device = comm->dev;
    return ncclSuccess;
}

/* ---- data movement ------------------------------------------------------ */

static size_t type_size(int t) {
    switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
    }
}

/* What a message belongs to, so calls that differ across ranks are caught. */
enum { TAG_REDUCE_SCATTER = 1, TAG_ALLREDUCE_GATHER, TAG_ALLGATHER, TAG_BROADCAST, TAG_P2P };
static const char *tag_name(uint32_t tag) {
    switch (tag) {
    case TAG_REDUCE_SCATTER: return "AllReduce (reduce-scatter)";
    case TAG_ALLREDUCE_GATHER: return "AllReduce (all-gather)";
    case TAG_ALLGATHER: return "AllGather";
    case TAG_BROADCAST: return "Broadcast";
    case TAG_P2P: return "Send/Recv";
    default: return "an unknown operation";
    }
}

/* One message to or from a peer: a 16-byte header {magic, tag, length} and the payload. */
struct xfer {
    int peer, sending;
    uint32_t tag;
    uint64_t len, done; /* done counts header bytes too */
    char *buf;
    uint32_t hdr[4];
};

static ncclResult_t step(struct ncclComm *c, struct xfer *x) {
    size_t total = 16 + x->len;
    char *at = x->done < 16 ? (char *)x->hdr + x->done : x->buf + (x->done - 16);
    size_t want = x->done < 16 ? 16 - x->done : total - x->done;
    if (want > (4 << 20)) want = 4 << 20;
    int fd = c->fds[x->peer];
    ssize_t n = x->sending ? send(fd, at, want, MSG_NOSIGNAL) : recv(fd, at, want, 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return ncclSuccess;
    if (n <= 0) {
        WARN(c->dev, "NET/Socket : rank %d: %s rank %d failed: %s", c->rank, x->sending ? "send to" : "receive from", x->peer,
             n == 0 ? "Connection closed by remote peer" : strerror(errno));
        return ncclRemoteError;
    }
    uint64_t before = x->done;
    x->done += (uint64_t)n;
    if (!x->sending && before < 16 && x->done >= 16) {
        uint64_t len;
        memcpy(&len, &x->hdr[2], 8);
        if (x->hdr[0] != WIRE_MAGIC || x->hdr[1] != x->tag || len != x->len) {
            WARN(c->dev, "fake libnccl: rank %d expected %llu bytes of %s from rank %d, got %llu bytes of %s: the ranks' calls do not match",
                 c->rank, (unsigned long long)x->len, tag_name(x->tag), x->peer, (unsigned long long)len,
                 x->hdr[0] == WIRE_MAGIC ? tag_name(x->hdr[1]) : "garbage");
            return ncclInvalidUsage;
        }
    }
    return ncclSuccess;
}

/* Moves a set of messages concurrently; per peer and direction, in order. */
static ncclResult_t move(struct ncclComm *c, struct xfer *x, int n) {
    long limit = env_long("FAKE_NCCL_OP_TIMEOUT_MS", 0);
    uint64_t deadline = limit > 0 ? now_ms() + (uint64_t)limit : 0;
    int np = c->nranks;
    int *hs = malloc(sizeof(int) * (size_t)np * 2), *hr = hs + np;
    struct pollfd *p = malloc(sizeof *p * (size_t)np);
    int *who = malloc(sizeof(int) * (size_t)np);
    ncclResult_t r = ncclSuccess;
    if (!hs || !p || !who) { r = ncclSystemError; goto out; }
    for (int i = 0; i < n; i++) {
        x[i].done = 0;
        x[i].hdr[0] = WIRE_MAGIC;
        x[i].hdr[1] = x[i].tag;
        memcpy(&x[i].hdr[2], &x[i].len, 8);
    }
    for (;;) {
        for (int i = 0; i < np; i++) hs[i] = hr[i] = -1;
        for (int i = 0; i < n; i++) {
            if (x[i].done >= 16 + x[i].len) continue;
            int *h = x[i].sending ? hs : hr;
            if (h[x[i].peer] < 0) h[x[i].peer] = i;
        }
        int m = 0;
        for (int i = 0; i < np; i++) {
            if (hs[i] < 0 && hr[i] < 0) continue;
            p[m] = (struct pollfd){c->fds[i], (short)((hs[i] >= 0 ? POLLOUT : 0) | (hr[i] >= 0 ? POLLIN : 0)), 0};
            who[m++] = i;
        }
        if (!m) break;
        if ((r = interrupted(c, deadline, "an operation to complete"))) {
            if (r == ncclInternalError) WARN(c->dev, "fake libnccl: rank %d: operation aborted", c->rank);
            goto out;
        }
        int k = poll(p, (nfds_t)m, SLICE_MS);
        if (k < 0 && errno != EINTR) { WARN(c->dev, "fake libnccl: poll: %s", strerror(errno)); r = ncclSystemError; goto out; }
        for (int j = 0; j < m && k > 0; j++) {
            short ev = p[j].revents;
            if (!ev) continue;
            int peer = who[j];
            if (hr[peer] >= 0 && (ev & (POLLIN | POLLHUP | POLLERR)) && (r = step(c, &x[hr[peer]]))) goto out;
            if (hs[peer] >= 0 && (ev & (POLLOUT | POLLHUP | POLLERR)) && (r = step(c, &x[hs[peer]]))) goto out;
        }
    }
out:
    free(hs);
    free(p);
    free(who);
    return r;
}

#define REDUCE(T)                                                                         \
    static void reduce_##T(void *acc_, const void *in_, size_t n, int op) {               \
        T *acc = acc_;                                                                    \
        const T *in = in_;                                                                \
        for (size_t i = 0; i < n; i++) switch (op) {                                      \
            case ncclProd: acc[i] = (T)(acc[i] * in[i]); break;                          \
            case ncclMax: if (in[i] > acc[i]) acc[i] = in[i]; break;                      \
            case ncclMin: if (in[i] < acc[i]) acc[i] = in[i]; break;                      \
            default: acc[i] = (T)(acc[i] + in[i]); break;                                 \
            }                                                                             \
    }                                                                                     \
    static void divide_##T(void *acc_, size_t n, int by) {                                \
        T *acc = acc_;                                                                    \
        for (size_t i = 0; i < n; i++) acc[i] = (T)(acc[i] / by);                         \
    }
REDUCE(int8_t)
REDUCE(uint8_t)
REDUCE(int32_t)
REDUCE(uint32_t)
REDUCE(int64_t)
REDUCE(uint64_t)
REDUCE(float)
REDUCE(double)

static void reduce_into(int t, void *acc, const void *in, size_t n, int op) {
    switch (t) {
    case ncclInt8: reduce_int8_t(acc, in, n, op); break;
    case ncclUint8: reduce_uint8_t(acc, in, n, op); break;
    case ncclInt32: reduce_int32_t(acc, in, n, op); break;
    case ncclUint32: reduce_uint32_t(acc, in, n, op); break;
    case ncclInt64: reduce_int64_t(acc, in, n, op); break;
    case ncclUint64: reduce_uint64_t(acc, in, n, op); break;
    case ncclFloat32: reduce_float(acc, in, n, op); break;
    case ncclFloat64: reduce_double(acc, in, n, op); break;
    }
}
static void divide(int t, void *acc, size_t n, int by) {
    switch (t) {
    case ncclInt8: divide_int8_t(acc, n, by); break;
    case ncclUint8: divide_uint8_t(acc, n, by); break;
    case ncclInt32: divide_int32_t(acc, n, by); break;
    case ncclUint32: divide_uint32_t(acc, n, by); break;
    case ncclInt64: divide_int64_t(acc, n, by); break;
    case ncclUint64: divide_uint64_t(acc, n, by); break;
    case ncclFloat32: divide_float(acc, n, by); break;
    case ncclFloat64: divide_double(acc, n, by); break;
    }
}

/* Reduce-scatter then all-gather: chunk k (elements [k*count/n, (k+1)*count/n))
 * is reduced by rank k, in rank order, then sent to everyone. */
static ncclResult_t all_reduce(struct ncclComm *c, struct op *o) {
    int n = c->nranks, me = c->rank;
    size_t es = type_size(o->dtype), bytes = o->count * es;
    char *out = o->rbuf;
    if (o->sbuf != out) memmove(out, o->sbuf, bytes);
    if (n == 1) {
        if (o->redop == ncclAvg) divide(o->dtype, out, o->count, 1);
        return ncclSuccess;
    }
#define CHUNK_AT(k) ((size_t)(k) * o->count / (size_t)n)
    size_t mine = CHUNK_AT(me + 1) - CHUNK_AT(me);
    char *got = malloc(mine * es * (size_t)n + 1);
    struct xfer *x = calloc((size_t)n * 2, sizeof *x);
    ncclResult_t r = ncclSuccess;
    if (!got || !x) { r = ncclSystemError; goto out; }
    int m = 0;
    for (int p = 0; p < n; p++) {
        if (p == me) continue;
        x[m++] = (struct xfer){.peer = p, .sending = 1, .tag = TAG_REDUCE_SCATTER, .len = (CHUNK_AT(p + 1) - CHUNK_AT(p)) * es, .buf = out + CHUNK_AT(p) * es};
        x[m++] = (struct xfer){.peer = p, .sending = 0, .tag = TAG_REDUCE_SCATTER, .len = mine * es, .buf = got + (size_t)p * mine * es};
    }
    if ((r = move(c, x, m))) goto out;
    /* In rank order, so every chunk's float sum is what any rank would compute. */
    memcpy(got + (size_t)me * mine * es, out + CHUNK_AT(me) * es, mine * es);
    memcpy(out + CHUNK_AT(me) * es, got, mine * es);
    for (int p = 1; p < n; p++) reduce_into(o->dtype, out + CHUNK_AT(me) * es, got + (size_t)p * mine * es, mine, o->redop);
    if (o->redop == ncclAvg) divide(o->dtype, out + CHUNK_AT(me) * es, mine, n);
    m = 0;
    for (int p = 0; p < n; p++) {
        if (p == me) continue;
        x[m++] = (struct xfer){.peer = p, .sending = 1, .tag = TAG_ALLREDUCE_GATHER, .len = mine * es, .buf = out + CHUNK_AT(me) * es};
        x[m++] = (struct xfer){.peer = p, .sending = 0, .tag = TAG_ALLREDUCE_GATHER, .len = (CHUNK_AT(p + 1) - CHUNK_AT(p)) * es, .buf = out + CHUNK_AT(p) * es};
    }
    r = move(c, x, m);
#undef CHUNK_AT
out:
    free(got);
    free(x);
    return r;
}

static ncclResult_t run_collective(struct ncclComm *c, struct op *o) {
    int n = c->nranks, me = c->rank;
    size_t bytes = o->count * type_size(o->dtype);
    struct xfer *x = calloc((size_t)n * 2, sizeof *x);
    ncclResult_t r = ncclSuccess;
    int m = 0;
    if (!x) return ncclSystemError;
    switch (o->kind) {
    case OP_ALLREDUCE:
        r = all_reduce(c, o);
        break;
    case OP_ALLGATHER: {
        char *out = o->rbuf;
        if (o->sbuf != out + (size_t)me * bytes) memmove(out + (size_t)me * bytes, o->sbuf, bytes);
        for (int p = 0; p < n; p++) {
            if (p == me) continue;
            x[m++] = (struct xfer){.peer = p, .sending = 1, .tag = TAG_ALLGATHER, .len = bytes, .buf = out + (size_t)me * bytes};
            x[m++] = (struct xfer){.peer = p, .sending = 0, .tag = TAG_ALLGATHER, .len = bytes, .buf = out + (size_t)p * bytes};
        }
        r = move(c, x, m);
        break;
    }
    case OP_BCAST:
        if (me == o->peer) {
            if (o->sbuf != o->rbuf) memmove(o->rbuf, o->sbuf, bytes);
            for (int p = 0; p < n; p++)
                if (p != me) x[m++] = (struct xfer){.peer = p, .sending = 1, .tag = TAG_BROADCAST, .len = bytes, .buf = o->rbuf};
        } else {
            x[m++] = (struct xfer){.peer = o->peer, .sending = 0, .tag = TAG_BROADCAST, .len = bytes, .buf = o->rbuf};
        }
        r = move(c, x, m);
        break;
    default:
        r = ncclInternalError;
    }
    free(x);
    return r;
}

/* Consecutive sends and receives progress together (a group's p2p batch);
 * messages to oneself are copied, the k-th send to the k-th receive. */
static ncclResult_t run_p2p(struct ncclComm *c, struct op *first, struct op *end) {
    int n = 0;
    for (struct op *o = first; o != end; o = o->next) n++;
    struct xfer *x = calloc((size_t)n + 1, sizeof *x);
    struct op **self_send = calloc((size_t)n + 1, sizeof *self_send), **self_recv = calloc((size_t)n + 1, sizeof *self_recv);
    int m = 0, ns = 0, nr = 0;
    ncclResult_t r = ncclSuccess;
    if (!x || !self_send || !self_recv) { r = ncclSystemError; goto out; }
    for (struct op *o = first; o != end; o = o->next) {
        size_t bytes = o->count * type_size(o->dtype);
        if (o->peer == c->rank) {
            if (o->kind == OP_SEND) self_send[ns++] = o; else self_recv[nr++] = o;
            continue;
        }
        x[m++] = (struct xfer){.peer = o->peer, .sending = o->kind == OP_SEND, .tag = TAG_P2P, .len = bytes,
                               .buf = o->kind == OP_SEND ? (char *)o->sbuf : (char *)o->rbuf};
    }
    for (int i = 0; i < ns || i < nr; i++) {
        if (i >= ns || i >= nr || self_send[i]->count * type_size(self_send[i]->dtype) != self_recv[i]->count * type_size(self_recv[i]->dtype)) {
            WARN(c->dev, "fake libnccl: rank %d: sends to itself do not match its receives from itself", c->rank);
            r = ncclInvalidUsage;
            goto out;
        }
        memmove(self_recv[i]->rbuf, self_send[i]->sbuf, self_send[i]->count * type_size(self_send[i]->dtype));
    }
    r = move(c, x, m);
out:
    free(x);
    free(self_send);
    free(self_recv);
    return r;
}

/* Runs and frees the communicator's queued operations; the first error also
 * becomes its asynchronous error (the communicator is broken afterwards). */
static ncclResult_t run_ops(struct ncclComm *c) {
    ncclResult_t r = ncclSuccess;
    struct op *o = c->ops;
    atomic_fetch_add(&c->busy, 1);
    while (o && !r) {
        if (o->kind == OP_SEND || o->kind == OP_RECV) {
            struct op *end = o;
            while (end && (end->kind == OP_SEND || end->kind == OP_RECV)) end = end->next;
            r = run_p2p(c, o, end);
            o = end;
        } else {
            r = run_collective(c, o);
            o = o->next;
        }
    }
    for (struct op *p = c->ops, *next; p; p = next) { next = p->next; free(p); }
    c->ops = c->ops_tail = NULL;
    if (r) atomic_store(&c->state, r);
    atomic_fetch_sub(&c->busy, 1);
    return r;
}

static void *ops_thread(void *arg) {
    struct ncclComm *c = arg;
    return (void *)(intptr_t)run_ops(c);
}

static atomic_long comm_calls;

/* FAKE_NCCL_FREEZE_POD_AFTER: a helper process stops this process and its parent,
 * waits, and lets them go on. */
static void freeze_pod(long ms) {
    pid_t self = getpid(), parent = getppid();
    pid_t helper = fork();
    if (helper != 0) return;
    kill(parent, SIGSTOP);
    kill(self, SIGSTOP);
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
    kill(parent, SIGCONT);
    kill(self, SIGCONT);
    _exit(0);
}

/* FAKE_NCCL_POISON: this rank's doubles in an all-gather become the poison value. */
static void poison(const void *sbuf, size_t count, int dtype) {
    const char *v = getenv("FAKE_NCCL_POISON");
    if (!v || !*v || !sbuf) return;
    double p = strcmp(v, "nan") == 0 ? NAN : strcmp(v, "inf") == 0 ? INFINITY : strcmp(v, "-inf") == 0 ? -INFINITY : strtod(v, NULL);
    size_t bytes = count * type_size(dtype);
    if (bytes % sizeof(double)) return;
    for (size_t i = 0; i < bytes / sizeof(double); i++) memcpy((char *)sbuf + i * sizeof(double), &p, sizeof p);
}

static ncclResult_t enqueue(struct ncclComm *c, enum opkind kind, const void *sbuf, void *rbuf, size_t count, int dtype, int redop, int peer) {
    long die_after = env_long("FAKE_NCCL_DIE_AFTER", -1), hang_after = env_long("FAKE_NCCL_HANG_AFTER", -1);
    long call = atomic_fetch_add(&comm_calls, 1);
    if (die_after >= 0 && call >= die_after) {
        INFO(c ? c->dev : 0, "fake libnccl: FAKE_NCCL_DIE_AFTER=%ld: exiting at %s", die_after, op_names[kind]);
        _exit(137);
    }
    if (env_long("FAKE_NCCL_KILL_POD_AFTER", -1) == call) {
        INFO(c ? c->dev : 0, "fake libnccl: FAKE_NCCL_KILL_POD_AFTER=%ld: killing the pod at %s", call, op_names[kind]);
        kill(getppid(), SIGKILL);
        _exit(137);
    }
    if (env_long("FAKE_NCCL_FREEZE_POD_AFTER", -1) == call) {
        INFO(c ? c->dev : 0, "fake libnccl: FAKE_NCCL_FREEZE_POD_AFTER=%ld: freezing the pod at %s", call, op_names[kind]);
        freeze_pod(env_long("FAKE_NCCL_FREEZE_MS", 8000));
    }
    if (kind == OP_ALLGATHER) poison(sbuf, count, dtype);
    if (hang_after >= 0 && call >= hang_after) {
        INFO(c ? c->dev : 0, "fake libnccl: FAKE_NCCL_HANG_AFTER=%ld: stuck in %s", hang_after, op_names[kind]);
        for (;;) pause();
    }
    if (!c) { WARN(0, "%s : comm argument is NULL", op_names[kind]); return ncclInvalidArgument; }
    int state = atomic_load(&c->state);
    if (state == ncclInProgress && !c->init_queued) {
        WARN(c->dev, "%s : communicator is still initialising; wait until ncclCommGetAsyncError says ncclSuccess", op_names[kind]);
        return ncclInvalidUsage;
    }
    if (state != ncclSuccess && state != ncclInProgress) {
        WARN(c->dev, "%s : communicator has an error (%s); abort it", op_names[kind], ncclGetErrorString(state));
        return (ncclResult_t)state;
    }
    if (!type_size(dtype)) { WARN(c->dev, "%s : invalid type %d", op_names[kind], dtype); return ncclInvalidArgument; }
    if (kind == OP_ALLREDUCE && (redop < ncclSum || redop > ncclAvg)) {
        WARN(c->dev, "%s : invalid reduction operation %d", op_names[kind], redop);
        return ncclInvalidArgument;
    }
    if (kind == OP_ALLREDUCE && (dtype == ncclFloat16 || dtype == ncclBfloat16 || dtype >= ncclFloat8e4m3)) {
        WARN(c->dev, "%s : fake libnccl does not reduce type %d", op_names[kind], dtype);
        return ncclInvalidArgument;
    }
    if ((kind == OP_SEND || kind == OP_RECV || kind == OP_BCAST) && (peer < 0 || peer >= c->nranks)) {
        WARN(c->dev, "%s : invalid %s %d", op_names[kind], kind == OP_BCAST ? "root" : "peer", peer);
        return ncclInvalidArgument;
    }
    if (count && ((kind != OP_RECV && !sbuf) || (kind != OP_SEND && !rbuf))) {
        WARN(c->dev, "%s : buffer argument is NULL", op_names[kind]);
        return ncclInvalidArgument;
    }
    struct op *o = calloc(1, sizeof *o);
    if (!o) return ncclSystemError;
    *o = (struct op){kind, sbuf, rbuf, count, dtype, redop, peer, NULL};
    if (c->ops_tail) c->ops_tail->next = o; else c->ops = o;
    c->ops_tail = o;
    if (group_depth > 0) return group_add(c) ? ncclSystemError : ncclSuccess;
    return run_ops(c);
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
    (void)stream;
    return enqueue(comm, OP_ALLGATHER, sendbuff, recvbuff, sendcount, datatype, 0, 0);
}
ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    (void)stream;
    return enqueue(comm, OP_ALLREDUCE, sendbuff, recvbuff, count, datatype, op, 0);
}
ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream) {
    (void)stream;
    return enqueue(comm, OP_BCAST, sendbuff, recvbuff, count, datatype, 0, root);
}
ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm, cudaStream_t stream) {
    (void)stream;
    return enqueue(comm, OP_SEND, sendbuff, NULL, count, datatype, 0, peer);
}
ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm, cudaStream_t stream) {
    (void)stream;
    return enqueue(comm, OP_RECV, NULL, recvbuff, count, datatype, 0, peer);
}

ncclResult_t ncclGroupStart(void) {
    group_depth++;
    return ncclSuccess;
}

/* The outermost ncclGroupEnd starts the queued inits (one thread each), waits
 * for the blocking ones, then runs every communicator's queued operations on
 * threads of their own, so ranks of one process exchange data concurrently. */
ncclResult_t ncclGroupEnd(void) {
    if (group_depth <= 0) {
        WARN(0, "ncclGroupEnd: not in a group call.");
        return ncclInvalidUsage;
    }
    if (--group_depth > 0) return ncclSuccess;
    struct ncclComm **comms = group_comms;
    int n = group_n;
    group_comms = NULL;
    group_n = group_cap = 0;
    ncclResult_t r = ncclSuccess;
    int pending = 0;
    for (int i = 0; i < n; i++) {
        struct ncclComm *c = comms[i];
        if (!c->init_queued) continue;
        c->init_queued = 0;
        if (pthread_create(&c->thread, NULL, init_thread, c)) {
            atomic_store(&c->state, ncclSystemError);
            if (!r) r = ncclSystemError;
            continue;
        }
        c->thread_started = 1;
    }
    for (int i = 0; i < n; i++) {
        struct ncclComm *c = comms[i];
        if (!c->thread_started || atomic_load(&c->state) != ncclInProgress) continue;
        if (c->blocking) {
            pthread_join(c->thread, NULL);
            c->thread_started = 0;
            ncclResult_t s = (ncclResult_t)atomic_load(&c->state);
            if (s && !r) r = s;
        } else {
            pending = 1;
        }
    }
    int with_ops = 0;
    pthread_t *threads = calloc((size_t)n + 1, sizeof *threads);
    char *started = calloc((size_t)n + 1, 1);
    if (!threads || !started) { free(threads); free(started); free(comms); return ncclSystemError; }
    for (int i = 0; i < n; i++) {
        struct ncclComm *c = comms[i];
        if (!c->ops) continue;
        if (atomic_load(&c->state) != ncclSuccess) {
            WARN(c->dev, "ncclGroupEnd: rank %d's communicator is not ready (%s)", c->rank, ncclGetErrorString(atomic_load(&c->state)));
            for (struct op *o = c->ops, *next; o; o = next) { next = o->next; free(o); }
            c->ops = c->ops_tail = NULL;
            if (!r) r = ncclInvalidUsage;
            continue;
        }
        with_ops++;
        if (!pthread_create(&threads[i], NULL, ops_thread, c)) started[i] = 1;
        else if (!r) r = ncclSystemError;
    }
    for (int i = 0; i < n; i++) {
        if (!started[i]) continue;
        void *res;
        pthread_join(threads[i], &res);
        if (res && !r) r = (ncclResult_t)(intptr_t)res;
    }
    free(threads);
    free(started);
    free(comms);
    (void)with_ops;
    if (!r && pending) r = ncclInProgress;
    return r;
}
