/* A test driver that calls libnccl the way the gang check (issue 12) will:
 * one process per node driving LOCAL communicators, nranks = NNODES x LOCAL,
 * rank = NODE x LOCAL + local index.
 *
 *   gang_driver NODE NNODES [LOCAL]
 *
 * Steps: ncclGetUniqueId (NCCL_COMM_ID must be set), non-blocking
 * ncclCommInitRankConfig of every local communicator inside one group, a
 * bounded wait on ncclCommGetAsyncError (GANG_TIMEOUT_MS, default 10000) that
 * ncclCommAborts everything when it runs out, an all-gather of a 64-byte
 * record per rank, all-reduces (float32 and int32 sums, uint8 max) of
 * GANG_FLOATS elements (default 262144) checked element by element, a
 * broadcast, then ring-shift rounds k = 1..nranks-1 in which every rank sends
 * GANG_P2P_BYTES (default 4 MiB) to rank + k and receives from rank - k,
 * timed. GANG_BLOCKING=1 initialises with blocking ncclCommInitRank instead;
 * GANG_BAD_CONFIG=1 passes a config that NCCL_CONFIG_INITIALIZER did not set.
 * GANG_CUDA_LIB=path/libcuda.so.1 adds an all-reduce on buffers from
 * cuMemAlloc_v2 in each local GPU's primary context (cuMemsetD32Async to fill,
 * cuMemcpyDtoH_v2 to read back), as the gang will allocate them.
 * GANG_NCCL_LIB names the library to dlopen (default libnccl.so.2).
 *
 * It prints one fact per line on stdout (what the tests read) and exits
 * 0 all checks passed, 2 the library lacks a symbol or the arguments are bad,
 * 3 init timed out (after aborting), 4 init failed, 5 an operation failed,
 * 6 an operation returned wrong data.
 *
 * The ABI is declared here from NVIDIA/nccl src/nccl.h.in, with the 2.21
 * ncclConfig_t (ncclConfig_v21700): smaller than the 2.28 one, so the library
 * must honour the config's size field as NCCL does. */
#include <dlfcn.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int ncclResult_t; /* ncclSuccess 0 ... ncclInProgress 7 */
enum { ncclSuccess = 0, ncclInProgress = 7 };
enum { ncclUint8 = 1, ncclInt32 = 2, ncclFloat32 = 7 };
enum { ncclSum = 0, ncclMax = 2 };
typedef struct { char internal[128]; } ncclUniqueId;
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
} ncclConfig_v21700;
typedef void *ncclComm_t;

static ncclResult_t (*GetVersion)(int *);
static ncclResult_t (*GetUniqueId)(ncclUniqueId *);
static ncclResult_t (*InitRank)(ncclComm_t *, int, ncclUniqueId, int);
static ncclResult_t (*InitRankConfig)(ncclComm_t *, int, ncclUniqueId, int, ncclConfig_v21700 *);
static ncclResult_t (*GetAsyncError)(ncclComm_t, ncclResult_t *);
static ncclResult_t (*Abort)(ncclComm_t);
static ncclResult_t (*Destroy)(ncclComm_t);
static ncclResult_t (*Count)(ncclComm_t, int *);
static ncclResult_t (*UserRank)(ncclComm_t, int *);
static ncclResult_t (*CuDevice)(ncclComm_t, int *);
static ncclResult_t (*GroupStart)(void);
static ncclResult_t (*GroupEnd)(void);
static ncclResult_t (*AllGather)(const void *, void *, size_t, int, ncclComm_t, void *);
static ncclResult_t (*AllReduce)(const void *, void *, size_t, int, int, ncclComm_t, void *);
static ncclResult_t (*Broadcast)(const void *, void *, size_t, int, int, ncclComm_t, void *);
static ncclResult_t (*Send)(const void *, size_t, int, int, ncclComm_t, void *);
static ncclResult_t (*Recv)(void *, size_t, int, int, ncclComm_t, void *);
static const char *(*ErrorString)(ncclResult_t);
static const char *(*LastError)(ncclComm_t);

static void *need(void *lib, const char *name) {
    void *f = dlsym(lib, name);
    if (!f) {
        printf("missing symbol %s\n", name);
        exit(2);
    }
    return f;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static long env_long(const char *name, long fallback) {
    const char *v = getenv(name);
    return v && *v ? strtol(v, NULL, 10) : fallback;
}

static int nnodes, local, nranks, node;
static ncclComm_t *comms;

/* Reports a failed call with NCCL's own words and exits 5. */
static void check(const char *what, ncclResult_t r) {
    if (r == ncclSuccess) return;
    printf("%s failed: %d %s: %s\n", what, r, ErrorString(r), LastError(NULL));
    fflush(stdout);
    exit(5);
}

/* One call per local communicator inside a group, as one process drives every local GPU. */
#define EACH_LOCAL(what, call)                                  \
    do {                                                        \
        check("ncclGroupStart", GroupStart());                  \
        for (int l = 0; l < local; l++) {                       \
            int rank = node * local + l;                        \
            (void)rank;                                         \
            check(what, call);                                  \
        }                                                       \
        check(what, GroupEnd());                                \
    } while (0)

static void init_all(void) {
    ncclUniqueId id;
    ncclResult_t r = GetUniqueId(&id);
    if (r) {
        printf("ncclGetUniqueId failed: %d %s: %s\n", r, ErrorString(r), LastError(NULL));
        exit(4);
    }
    int blocking = env_long("GANG_BLOCKING", 0) == 1;
    /* NCCL_CONFIG_INITIALIZER of 2.21.5, then blocking = 0. */
    ncclConfig_v21700 config = {sizeof config, 0xcafebeef, 22105, 0, INT_MIN, INT_MIN, INT_MIN, NULL, INT_MIN};
    if (env_long("GANG_BAD_CONFIG", 0) == 1) config.magic = 0;
    double start = now_s();
    GroupStart();
    for (int l = 0; l < local; l++) {
        int rank = node * local + l;
        r = blocking ? InitRank(&comms[l], nranks, id, rank) : InitRankConfig(&comms[l], nranks, id, rank, &config);
        if (r != ncclSuccess && r != ncclInProgress) {
            printf("init failed: rank %d: %d %s: %s\n", rank, r, ErrorString(r), LastError(NULL));
            exit(4);
        }
    }
    r = GroupEnd();
    if (r != ncclSuccess && r != ncclInProgress) {
        printf("init failed: group end: %d %s: %s\n", r, ErrorString(r), LastError(NULL));
        exit(4);
    }
    if (blocking && r != ncclSuccess) {
        printf("init failed: a blocking group returned %d\n", r);
        exit(4);
    }
    /* The gang's own bound: wait until every communicator is ready, or abort them all. */
    long timeout_ms = env_long("GANG_TIMEOUT_MS", 10000);
    for (;;) {
        int pending = 0;
        for (int l = 0; l < local; l++) {
            ncclResult_t s;
            check("ncclCommGetAsyncError", GetAsyncError(comms[l], &s));
            if (s == ncclInProgress) pending++;
            else if (s != ncclSuccess) {
                printf("init failed: rank %d: %d %s: %s\n", node * local + l, s, ErrorString(s), LastError(comms[l]));
                for (int k = 0; k < local; k++) Abort(comms[k]);
                exit(4);
            }
        }
        if (!pending) break;
        if ((now_s() - start) * 1000 > (double)timeout_ms) {
            printf("init timeout after %ld ms: aborting %d communicators\n", timeout_ms, local);
            for (int l = 0; l < local; l++) {
                double t = now_s();
                ncclResult_t a = Abort(comms[l]);
                printf("abort rank %d returned %d in %.0f ms\n", node * local + l, a, (now_s() - t) * 1000);
            }
            fflush(stdout);
            exit(3);
        }
        usleep(10000);
    }
    for (int l = 0; l < local; l++) {
        int n, rank, dev;
        check("ncclCommCount", Count(comms[l], &n));
        check("ncclCommUserRank", UserRank(comms[l], &rank));
        check("ncclCommCuDevice", CuDevice(comms[l], &dev));
        printf("joined rank %d nranks %d device %d\n", rank, n, dev);
    }
}

/* The record every rank contributes: fixed size, versioned, deterministic. */
static void record(char out[64], int rank, int version) {
    memset(out, 0, 64);
    snprintf(out, 64, "gang-record v1 rank %d node %d local %d nccl %d", rank, rank / local, rank % local, version);
}

static void wrong(const char *what, size_t at, double got, double want) {
    printf("%s wrong at %zu: got %g want %g\n", what, at, got, want);
    fflush(stdout);
    exit(6);
}

/* An all-reduce on CUDA driver allocations: local GPU l is device l. */
static void cuda_all_reduce(const char *path, size_t n) {
    void *cuda = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!cuda) {
        printf("dlopen: %s\n", dlerror());
        exit(2);
    }
    int (*Init)(unsigned) = need(cuda, "cuInit");
    int (*Retain)(void **, int) = need(cuda, "cuDevicePrimaryCtxRetain");
    int (*SetCurrent)(void *) = need(cuda, "cuCtxSetCurrent");
    int (*Alloc)(unsigned long long *, size_t) = need(cuda, "cuMemAlloc_v2");
    int (*Memset)(unsigned long long, unsigned, size_t, void *) = need(cuda, "cuMemsetD32Async");
    int (*ToHost)(void *, unsigned long long, size_t) = need(cuda, "cuMemcpyDtoH_v2");
    int (*Free)(unsigned long long) = need(cuda, "cuMemFree_v2");
    unsigned long long *buf = calloc((size_t)local, sizeof *buf);
    int rc = Init(0);
    for (int l = 0; l < local && !rc; l++) {
        void *ctx;
        float value = (float)(node * local + l + 1);
        unsigned bits;
        memcpy(&bits, &value, 4);
        if (!(rc = Retain(&ctx, l)) && !(rc = SetCurrent(ctx)) && !(rc = Alloc(&buf[l], n * 4))) rc = Memset(buf[l], bits, n, NULL);
    }
    if (rc) {
        printf("cuda failed: CUresult %d\n", rc);
        exit(5);
    }
    EACH_LOCAL("ncclAllReduce", AllReduce((void *)(uintptr_t)buf[l], (void *)(uintptr_t)buf[l], n, ncclFloat32, ncclSum, comms[l], NULL));
    float *host = malloc(n * 4);
    for (int l = 0; l < local; l++) {
        if ((rc = ToHost(host, buf[l], n * 4))) {
            printf("cuda failed: cuMemcpyDtoH_v2 CUresult %d\n", rc);
            exit(5);
        }
        for (size_t i = 0; i < n; i++)
            if (host[i] != (float)(nranks * (nranks + 1) / 2)) wrong("allreduce cuda float32", i, host[i], nranks * (nranks + 1) / 2);
        Free(buf[l]);
    }
    printf("allreduce cuda float32 ok\n");
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 3) {
        printf("usage: gang_driver NODE NNODES [LOCAL]\n");
        return 2;
    }
    node = atoi(argv[1]);
    nnodes = atoi(argv[2]);
    local = argc > 3 ? atoi(argv[3]) : 1;
    if (nnodes < 1 || local < 1 || node < 0 || node >= nnodes) {
        printf("bad arguments: node %d of %d, %d local\n", node, nnodes, local);
        return 2;
    }
    nranks = nnodes * local;
    const char *path = getenv("GANG_NCCL_LIB");
    void *lib = dlopen(path && *path ? path : "libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        printf("dlopen: %s\n", dlerror());
        return 2;
    }
    GetVersion = need(lib, "ncclGetVersion");
    GetUniqueId = need(lib, "ncclGetUniqueId");
    InitRank = need(lib, "ncclCommInitRank");
    InitRankConfig = need(lib, "ncclCommInitRankConfig");
    GetAsyncError = need(lib, "ncclCommGetAsyncError");
    Abort = need(lib, "ncclCommAbort");
    Destroy = need(lib, "ncclCommDestroy");
    Count = need(lib, "ncclCommCount");
    UserRank = need(lib, "ncclCommUserRank");
    CuDevice = need(lib, "ncclCommCuDevice");
    GroupStart = need(lib, "ncclGroupStart");
    GroupEnd = need(lib, "ncclGroupEnd");
    AllGather = need(lib, "ncclAllGather");
    AllReduce = need(lib, "ncclAllReduce");
    Broadcast = need(lib, "ncclBroadcast");
    Send = need(lib, "ncclSend");
    Recv = need(lib, "ncclRecv");
    ErrorString = need(lib, "ncclGetErrorString");
    LastError = need(lib, "ncclGetLastError");

    int version;
    check("ncclGetVersion", GetVersion(&version));
    printf("version %d\n", version);
    comms = calloc((size_t)local, sizeof *comms);
    init_all();

    /* All-gather of one 64-byte record per rank: everyone gets all, in rank order. */
    char *mine = malloc(64 * (size_t)local), *all = malloc(64 * (size_t)nranks * (size_t)local);
    for (int l = 0; l < local; l++) record(mine + 64 * l, node * local + l, version);
    EACH_LOCAL("ncclAllGather", AllGather(mine + 64 * l, all + (size_t)l * 64 * nranks, 64, ncclUint8, comms[l], NULL));
    for (int l = 0; l < local; l++)
        for (int r = 0; r < nranks; r++) {
            char want[64];
            record(want, r, version);
            if (memcmp(all + ((size_t)l * nranks + r) * 64, want, 64)) {
                printf("allgather wrong: rank %d holds \"%.64s\" where rank %d's record belongs\n", node * local + l,
                       all + ((size_t)l * nranks + r) * 64, r);
                return 6;
            }
        }
    printf("allgather ok %d records\n", nranks);

    size_t n = (size_t)env_long("GANG_FLOATS", 262144);
    float *f = malloc(n * sizeof *f * (size_t)local);
    int32_t *in = malloc(n * sizeof *in * (size_t)local);
    uint8_t *u = malloc(n * (size_t)local);
    for (int l = 0; l < local; l++) {
        int rank = node * local + l;
        for (size_t i = 0; i < n; i++) {
            f[l * n + i] = (float)(rank + 1) + (float)(i % 7);
            in[l * n + i] = rank * 1000 + (int32_t)(i % 13);
            u[l * n + i] = (uint8_t)((rank * 37 + i) % 251);
        }
    }
    double t = now_s();
    EACH_LOCAL("ncclAllReduce", AllReduce(f + l * n, f + l * n, n, ncclFloat32, ncclSum, comms[l], NULL));
    double seconds = now_s() - t;
    for (int l = 0; l < local; l++)
        for (size_t i = 0; i < n; i++) {
            double want = nranks * (nranks + 1) / 2.0 + (double)nranks * (double)(i % 7);
            if (f[l * n + i] != (float)want) wrong("allreduce float32", i, f[l * n + i], want);
        }
    /* busbw as nccl-tests computes it for all-reduce: size * 2(n-1)/n / time. */
    printf("allreduce float32 ok %zu elements in %.6f s busbw %.0f B/s\n", n, seconds,
           (double)(n * 4) * 2.0 * (nranks - 1) / nranks / seconds);
    EACH_LOCAL("ncclAllReduce", AllReduce(in + l * n, in + l * n, n, ncclInt32, ncclSum, comms[l], NULL));
    for (int l = 0; l < local; l++)
        for (size_t i = 0; i < n; i++) {
            double want = 1000.0 * nranks * (nranks - 1) / 2 + (double)nranks * (double)(i % 13);
            if (in[l * n + i] != (int32_t)want) wrong("allreduce int32", i, in[l * n + i], want);
        }
    printf("allreduce int32 ok\n");
    EACH_LOCAL("ncclAllReduce", AllReduce(u + l * n, u + l * n, n, ncclUint8, ncclMax, comms[l], NULL));
    for (int l = 0; l < local; l++)
        for (size_t i = 0; i < n; i++) {
            unsigned want = 0;
            for (int r = 0; r < nranks; r++)
                if ((unsigned)((r * 37 + i) % 251) > want) want = (unsigned)((r * 37 + i) % 251);
            if (u[l * n + i] != want) wrong("allreduce uint8 max", i, u[l * n + i], want);
        }
    printf("allreduce uint8 max ok\n");
    const char *cuda = getenv("GANG_CUDA_LIB");
    if (cuda && *cuda) cuda_all_reduce(cuda, n);

    /* Broadcast from the last rank. */
    int32_t *b = calloc(1000 * (size_t)local, sizeof *b);
    for (int l = 0; l < local; l++)
        if (node * local + l == nranks - 1)
            for (int i = 0; i < 1000; i++) b[l * 1000 + i] = i * 3 + 1;
    EACH_LOCAL("ncclBroadcast", Broadcast(b + l * 1000, b + l * 1000, 1000, ncclInt32, nranks - 1, comms[l], NULL));
    for (int l = 0; l < local; l++)
        for (int i = 0; i < 1000; i++)
            if (b[l * 1000 + i] != i * 3 + 1) wrong("broadcast", (size_t)i, b[l * 1000 + i], i * 3 + 1);
    printf("broadcast ok\n");

    /* Ring shifts: in round k every rank sends to rank + k and receives from
     * rank - k, so nranks - 1 rounds measure every ordered pair once. */
    size_t bytes = (size_t)env_long("GANG_P2P_BYTES", 4 << 20);
    uint8_t *sb = malloc(bytes * (size_t)local + 1), *rb = malloc(bytes * (size_t)local + 1);
    for (int k = 1; k < nranks; k++) {
        for (int l = 0; l < local; l++) memset(sb + l * bytes, (node * local + l) * 31 + k, bytes);
        memset(rb, 0, bytes * (size_t)local);
        t = now_s();
        check("ncclGroupStart", GroupStart());
        for (int l = 0; l < local; l++) {
            int rank = node * local + l;
            check("ncclSend", Send(sb + l * bytes, bytes, ncclUint8, (rank + k) % nranks, comms[l], NULL));
            check("ncclRecv", Recv(rb + l * bytes, bytes, ncclUint8, (rank - k + nranks) % nranks, comms[l], NULL));
        }
        check("ncclGroupEnd", GroupEnd());
        seconds = now_s() - t;
        for (int l = 0; l < local; l++) {
            int rank = node * local + l, from = (rank - k + nranks) % nranks;
            uint8_t want = (uint8_t)(from * 31 + k);
            if (bytes && (rb[l * bytes] != want || rb[l * bytes + bytes - 1] != want))
                wrong("p2p", 0, rb[l * bytes], want);
            printf("p2p shift %d rank %d to %d from %d bytes %zu seconds %.6f rate %.0f\n", k, rank, (rank + k) % nranks, from,
                   bytes, seconds, (double)bytes / seconds);
        }
    }
    for (int l = 0; l < local; l++) check("ncclCommDestroy", Destroy(comms[l]));
    printf("done\n");
    return 0;
}
