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

CUresult cuInit(unsigned int flags) {
    if (injected("cuInit") >= 0) return injected("cuInit");
    if (flags != 0) return 1;
    if (scenario()->cuda_init) return S.cuda_init;
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
