/* Fakes for tests, one source: built with -DFAKE_LIBNCCL it is libnccl.so.2
 * (ncclGetVersion answers FAKE_NCCL_VERSION, default FAKE_NCCL_DEFAULT_VERSION, 22809
 * unless built with another: two copies of different versions in one process); built with
 * -DFAKE_NET_PLUGIN it is an NCCL net plugin exporting ncclNetPlugin_v9 named
 * "Libfabric" and the version string of aws-ofi-nccl FAKE_OFI_VERSION (default
 * 1.14.0), as aws-ofi-nccl does; -DFAKE_NET_V4_ONLY exports ncclNetPlugin_v4 alone,
 * as aws-ofi-nccl 1.4 did. Nothing initialises the plugin.
 *
 * For `bench nccl` the fake libnccl runs single-process all-reduces over the
 * fake libcuda's host-memory "devices": ncclGroupEnd sums the queued float
 * buffers and advances each stream's virtual clock at FAKE_NCCL_BUSBW GB/s
 * (default 200). With NCCL_DEBUG=INFO it logs connections via
 * FAKE_NCCL_TRANSPORT (default P2P/CUMEM) to NCCL_DEBUG_FILE, as NCCL does.
 * FAKE_NCCL_FAIL=init|allreduce returns ncclSystemError there;
 * FAKE_NCCL_WRONG=1 makes the sums wrong; FAKE_NCCL_HANG=1 hangs ncclGroupEnd;
 * FAKE_NCCL_ENV_LOG=FILE records the NCCL_ environment ncclCommInitAll saw.
 * With FAKE_NCCL_LOAD_LOG set, each load of either library appends a line
 * ("libnccl" or "plugin") to that file, so a test can count how often a
 * process loaded it. */
#include <stdlib.h>
#include <stdio.h>

__attribute__((constructor)) static void log_load(void) {
    const char *path = getenv("FAKE_NCCL_LOAD_LOG");
    if (!path) return;
    FILE *f = fopen(path, "a");
    if (!f) return;
#ifdef FAKE_LIBNCCL
    fputs("libnccl\n", f);
#else
    fputs("plugin\n", f);
#endif
    fclose(f);
}

#ifdef FAKE_LIBNCCL
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#ifndef FAKE_NCCL_DEFAULT_VERSION
#define FAKE_NCCL_DEFAULT_VERSION 22809
#endif

int ncclGetVersion(int *version) {
    const char *v = getenv("FAKE_NCCL_VERSION");
    *version = v ? atoi(v) : FAKE_NCCL_DEFAULT_VERSION;
    return 0;
}

struct comm { int rank, n; };
struct op { float *send, *recv; size_t count; void *stream; int n; };
static struct op queued[16];
static int nqueued, in_group;

static int wants(const char *name, const char *value) {
    const char *v = getenv(name);
    return v && strcmp(v, value) == 0;
}

const char *ncclGetErrorString(int rc) {
    switch (rc) {
    case 0: return "no error";
    case 2: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case 4: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    default: return "unknown result code";
    }
}

extern char **environ;

/* FAKE_NCCL_ENV_LOG=FILE: ncclCommInitAll appends every NCCL_ variable it sees. */
static void log_env(void) {
    const char *path = getenv("FAKE_NCCL_ENV_LOG");
    FILE *f = path ? fopen(path, "a") : NULL;
    if (!f) return;
    for (char **e = environ; *e; e++)
        if (strncmp(*e, "NCCL_", 5) == 0) fprintf(f, "%s\n", *e);
    fclose(f);
}

int ncclCommInitAll(void **comms, int n, const int *devlist) {
    (void)devlist;
    log_env();
    if (wants("FAKE_NCCL_FAIL", "init")) return 2;
    if (n < 1 || n > 16) return 4;
    const char *path = getenv("NCCL_DEBUG_FILE");
    FILE *log = wants("NCCL_DEBUG", "INFO") && path ? fopen(path, "a") : NULL;
    const char *transport = getenv("FAKE_NCCL_TRANSPORT") ? getenv("FAKE_NCCL_TRANSPORT") : "P2P/CUMEM";
    for (int r = 0; r < n; r++) {
        struct comm *c = calloc(1, sizeof *c); c->rank = r; c->n = n; comms[r] = c;
        if (log && n > 1)
            for (int ch = 0; ch < 2; ch++)
                fprintf(log, "fakehost:%d:%d [%d] NCCL INFO Channel %02d/0 : %d[%d] -> %d[%d] via %s\n",
                        (int)getpid(), (int)getpid(), r, ch, r, r, (r + 1) % n, (r + 1) % n, transport);
    }
    if (log) fclose(log);
    return 0;
}
int ncclCommDestroy(void *comm) { free(comm); return 0; }
int ncclGroupStart(void) { in_group++; return 0; }
int ncclAllReduce(const void *send, void *recv, size_t count, int dtype, int op, void *comm, void *stream) {
    if (wants("FAKE_NCCL_FAIL", "allreduce")) return 2;
    if (dtype != 7 || op != 0 || !in_group || nqueued >= 16) return 4;
    queued[nqueued++] = (struct op){ (float *)send, recv, count, stream, ((struct comm *)comm)->n };
    return 0;
}
int ncclGroupEnd(void) {
    if (wants("FAKE_NCCL_HANG", "1")) for (;;) pause();
    if (--in_group > 0) return 0;
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    void (*advance)(void *, double) = cuda ? (void (*)(void *, double))dlsym(cuda, "fake_cuda_advance") : NULL;
    if (!advance) return 2;
    double busbw = getenv("FAKE_NCCL_BUSBW") ? atof(getenv("FAKE_NCCL_BUSBW")) : 200;
    size_t count = nqueued ? queued[0].count : 0;
    /* Sum into the first receive buffer, then copy it to the others. */
    for (size_t i = 0; i < count; i++) {
        float sum = 0;
        for (int k = 0; k < nqueued; k++) sum += queued[k].send[i];
        queued[0].recv[i] = sum + (wants("FAKE_NCCL_WRONG", "1") && i == 0 ? 1.0f : 0.0f);
    }
    for (int k = 0; k < nqueued; k++) {
        if (k) memcpy(queued[k].recv, queued[0].recv, count * sizeof(float));
        double n = queued[k].n;
        advance(queued[k].stream, (double)count * 4 * 2 * (n - 1) / n / busbw);
    }
    nqueued = 0;
    return 0;
}
#endif

#ifdef FAKE_NET_PLUGIN
struct fake_net { const char *name; void *init; };
#ifdef FAKE_NET_V4_ONLY
/* aws-ofi-nccl up to 1.4 exported only the symbol of the NCCL headers it was built
 * with: ncclNetPlugin_v4 for NCCL 2.9 to 2.11 (aws/aws-ofi-nccl v1.4.0-aws). */
const struct fake_net ncclNetPlugin_v4 = { "AWS Libfabric", 0 };
#else
const struct fake_net ncclNetPlugin_v9 = { "Libfabric", 0 };
#endif
/* aws-ofi-nccl's PACKAGE_STRING, which its init log line is built from. */
#ifndef FAKE_OFI_VERSION
#define FAKE_OFI_VERSION "1.14.0"
#endif
__attribute__((used)) const char fake_ofi_package[] = "Initializing aws-ofi-nccl " FAKE_OFI_VERSION;
#endif
