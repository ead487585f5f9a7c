/* A fake libcuda.so.1 for tests: the CUDA driver calls nccl-preflight makes,
 * answered from the scenario file (see scenario.h). Like the real driver it
 * applies CUDA_VISIBLE_DEVICES (indices and GPU UUID prefixes; the list ends
 * at the first entry that names no GPU). */
#include "scenario.h"

typedef int CUresult;
static int visible[MAX_GPUS], nvisible = -1, cuda_initialised;

static void apply_visible(void) {
    const char *env = getenv("CUDA_VISIBLE_DEVICES");
    nvisible = 0;
    if (!env) { for (int i = 0; i < S.ngpus; i++) visible[nvisible++] = i; return; }
    char buf[256]; snprintf(buf, sizeof buf, "%s", env);
    for (char *tok = strtok(buf, ","); tok && nvisible < MAX_GPUS; tok = strtok(NULL, ",")) {
        while (*tok == ' ') tok++;
        int found = -1;
        if (!strncmp(tok, "GPU-", 4)) { for (int i = 0; i < S.ngpus; i++) if (!strncmp(S.gpus[i].uuid, tok, strlen(tok))) found = i; }
        else { char *end; long v = strtol(tok, &end, 10); if (*tok && (*end == 0 || *end == ' ') && v >= 0 && v < S.ngpus) found = (int)v; }
        if (found < 0) break;
        visible[nvisible++] = found;
    }
}

/* FAKE_CUDA_INIT_LOG names a file that gets a line "PID" per cuInit call: which
 * processes initialise CUDA. */
static void log_init(void) {
    const char *path = getenv("FAKE_CUDA_INIT_LOG");
    if (!path) return;
    FILE *f = fopen(path, "a");
    if (f) { fprintf(f, "%d\n", (int)getpid()); fclose(f); }
}

CUresult cuInit(unsigned int flags) {
    log_init();
    if (injected("cuInit") >= 0) return injected("cuInit");
    if (flags != 0) return 1;
    if (scenario()->cuda_init_ms) usleep((useconds_t)S.cuda_init_ms * 1000);
    if (S.cuda_init) return S.cuda_init;
    apply_visible();
    cuda_initialised = 1;
    return 0;
}
CUresult cuDriverGetVersion(int *v) { scenario(); *v = S.cuda_version; return 0; }
CUresult cuDeviceGetCount(int *n) { if (injected("cuDeviceGetCount") >= 0) return 999; if (!cuda_initialised) return 3; *n = nvisible; return 0; }
CUresult cuDeviceGet(int *dev, int ordinal) {
    if (!cuda_initialised) return 3;
    if (ordinal < 0 || ordinal >= nvisible) return 101;
    *dev = ordinal; return 0;
}
/* CUDA prints a 4-digit domain in upper case: 0000:10:1C.0 */
CUresult cuDeviceGetPCIBusId(char *out, int len, int dev) {
    if (!cuda_initialised) return 3;
    if (dev < 0 || dev >= nvisible || len < 13) return 1;
    unsigned dom = 0, b = 0, d = 0, fn = 0;
    sscanf(S.gpus[visible[dev]].bus, "%x:%x:%x.%x", &dom, &b, &d, &fn);
    snprintf(out, (size_t)len, "%04X:%02X:%02X.%X", dom, b, d, fn);
    return 0;
}
CUresult cuDeviceCanAccessPeer(int *can, int dev, int peer) {
    if (injected("cuDeviceCanAccessPeer") >= 0) for (;;) pause();
    if (!cuda_initialised) return 3;
    if (dev < 0 || dev >= nvisible || peer < 0 || peer >= nvisible) return 101;
    int a = visible[dev], b = visible[peer];
    *can = S.peer[a][b] >= 0 ? S.peer[a][b] : S.p2p[a][b][0] == 0;
    return 0;
}

/* What `bench` calls. Device memory is host memory; every stream keeps a
 * virtual clock that each copy advances at the scenario's speed (1 GB/s is one
 * byte per ns), so measured bandwidth is exact and tests need no real time.
 * Work queued on a stream starts no earlier than the host's "now": the latest
 * time the host waited for (stream or event synchronize). */
#include <stdint.h>
struct fake_ctx { int ordinal; };
struct fake_stream { int ordinal; double clock_ns; };
struct fake_event { double t_ns; int recorded; };
static struct fake_ctx contexts[MAX_GPUS];
static int current = -1;
static int peer_on[MAX_GPUS][MAX_GPUS];
static double host_now;
static struct fake_stream *queue_on(void *s) {
    struct fake_stream *st = s;
    if (st->clock_ns < host_now) st->clock_ns = host_now;
    return st;
}
typedef unsigned long long CUdeviceptr;

CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev) {
    if (!cuda_initialised) return 3;
    if (dev < 0 || dev >= nvisible) return 101;
    contexts[dev].ordinal = dev; *ctx = &contexts[dev]; return 0;
}
CUresult cuCtxSetCurrent(void *ctx) { current = ctx ? ((struct fake_ctx *)ctx)->ordinal : -1; return 0; }
CUresult cuCtxEnablePeerAccess(void *peer, unsigned flags) {
    if (injected("cuCtxEnablePeerAccess") >= 0) return injected("cuCtxEnablePeerAccess");
    if (current < 0) return 201;
    int p = ((struct fake_ctx *)peer)->ordinal, a = visible[current], b = visible[p];
    int can = S.peer[a][b] >= 0 ? S.peer[a][b] : S.p2p[a][b][0] == 0;
    if (!can) return 217; /* CUDA_ERROR_PEER_ACCESS_UNSUPPORTED */
    if (peer_on[current][p]) return 704;
    peer_on[current][p] = 1; return 0;
}
CUresult cuMemAlloc_v2(CUdeviceptr *ptr, size_t n) {
    if (injected("cuMemAlloc_v2") >= 0) return injected("cuMemAlloc_v2");
    if (current < 0) return 201;
    void *p = malloc(n ? n : 1); if (!p) return 2;
    *ptr = (CUdeviceptr)(uintptr_t)p; return 0;
}
CUresult cuMemFree_v2(CUdeviceptr p) { free((void *)(uintptr_t)p); return 0; }
CUresult cuMemsetD32Async(CUdeviceptr p, unsigned v, size_t n, void *stream) {
    (void)stream; uint32_t *w = (uint32_t *)(uintptr_t)p; for (size_t i = 0; i < n; i++) w[i] = v; return 0;
}
CUresult cuMemcpyPeerAsync(CUdeviceptr dst, void *dctx, CUdeviceptr src, void *sctx, size_t n, void *stream) {
    if (injected("cuMemcpyPeerAsync") >= 0) return injected("cuMemcpyPeerAsync");
    int from = ((struct fake_ctx *)sctx)->ordinal, to = ((struct fake_ctx *)dctx)->ordinal;
    memcpy((void *)(uintptr_t)dst, (void *)(uintptr_t)src, n);
    if (S.corrupt[visible[from]][visible[to]] && n) ((unsigned char *)(uintptr_t)dst)[n / 2] ^= 0xff;
    queue_on(stream)->clock_ns += (double)n / S.bw[visible[from]][visible[to]];
    return 0;
}
CUresult cuMemcpyDtoH_v2(void *host, CUdeviceptr src, size_t n) { memcpy(host, (void *)(uintptr_t)src, n); return 0; }
/* The gang's calls: copies up are synchronous, and every stream's work (copies here,
 * the fake libnccl's operations) has completed when its call returned. */
CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *host, size_t n) { memcpy((void *)(uintptr_t)dst, host, n); return 0; }
CUresult cuStreamQuery(void *s) {
    if (injected("cuStreamQuery") >= 0) return injected("cuStreamQuery");
    (void)s; return 0;
}
CUresult cuStreamCreate(void **s, unsigned flags) {
    (void)flags; if (current < 0) return 201;
    struct fake_stream *st = calloc(1, sizeof *st); st->ordinal = current; *s = st; return 0;
}
CUresult cuStreamSynchronize(void *s) {
    if (injected("cuStreamSynchronize") >= 0) return injected("cuStreamSynchronize");
    struct fake_stream *st = s; if (st->clock_ns > host_now) host_now = st->clock_ns;
    return 0;
}
CUresult cuStreamWaitEvent(void *s, void *e, unsigned flags) {
    (void)flags; struct fake_stream *st = queue_on(s); struct fake_event *ev = e;
    if (ev->t_ns > st->clock_ns) st->clock_ns = ev->t_ns;
    return 0;
}
CUresult cuEventCreate(void **e, unsigned flags) { (void)flags; *e = calloc(1, sizeof(struct fake_event)); return 0; }
CUresult cuEventRecord(void *e, void *s) { struct fake_event *ev = e; ev->t_ns = queue_on(s)->clock_ns; ev->recorded = 1; return 0; }
CUresult cuEventSynchronize(void *e) {
    if (injected("cuEventSynchronize") >= 0) return injected("cuEventSynchronize");
    struct fake_event *ev = e; if (ev->t_ns > host_now) host_now = ev->t_ns;
    return 0;
}
CUresult cuEventElapsedTime(float *ms, void *start, void *end) {
    struct fake_event *a = start, *b = end;
    if (!a->recorded || !b->recorded) return 600; /* CUDA_ERROR_NOT_READY */
    *ms = (float)((b->t_ns - a->t_ns) / 1e6); return 0;
}
/* For the fake libnccl: a collective that took `ns` on this stream. */
void fake_cuda_advance(void *stream, double ns) { queue_on(stream)->clock_ns += ns; }
