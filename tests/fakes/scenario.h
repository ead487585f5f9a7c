/* Scenario files for the fake NVIDIA libraries (tests only).
 *
 * The fakes stand in for libnvidia-ml.so.1 and libcuda.so.1. nccl-preflight
 * loads them through its normal dlopen path (LD_LIBRARY_PATH or
 * --nvml-lib/--cuda-lib); what they answer comes from the file named by
 * FAKE_GPU_SCENARIO, one directive per line ('#' starts a comment):
 *
 *   nvml_init RC                      nvmlInit_v2's return code (default SUCCESS)
 *   driver VERSION                    nvmlSystemGetDriverVersion
 *   cuda_version N                    NVML's and CUDA's driver version (12020)
 *   gpu BUS CC MEM_MIB NUMA CPUS UUID NAME...
 *   link GPU|* FIRST-LAST STATE VERSION REMOTE TYPE
 *                                     REMOTE: a bus id, or gpuN for GPU N's bus id
 *                                     TYPE: gpu | switch
 *   speed GPU|* MBPS                  NVLink speed per link (field 90)
 *   pcie GPU|* GEN WIDTH
 *   p2p A|* B|* READ WRITE NVLINK ATOMICS PROP   (OK CNS GNS TNS DISABLED NS U)
 *   topo A|* B|* LEVEL                (INTERNAL SINGLE MULTIPLE HOSTBRIDGE NODE SYSTEM)
 *   fail SYMBOL RC                    that NVML function returns RC
 *   refuse_field FIELD                nvmlDeviceGetFieldValues answers NOT_SUPPORTED for that
 *                                     field id (as older drivers do), so the per-call path runs
 *   hang SYMBOL                       that function never returns
 *   fabric GPU|* STATE STATUS [UUID CLIQUE]
 *                                     nvmlDeviceGetGpuFabricInfo (STATE 0-3; default: NOT_SUPPORTED);
 *                                     UUID: the NVLink cluster's (32 hex digits, dashes ignored;
 *                                     default all zero), CLIQUE: the clique id (default 0)
 *   ecc GPU|* N                       uncorrectable volatile ECC errors (default 0)
 *   remap GPU|* CORR UNC PENDING FAIL remapped rows (default 0 0 0 0)
 *   recovery GPU|* ACTION             field 230 GPU_RECOVERY_ACTION (default: NOT_SUPPORTED)
 *   nvlink_errors GPU|* REPLAY RECOVERY CRC   per-link error counters (default 0)
 *   xid GPU CODE AFTER_MS             one critical XID event on GPU, AFTER_MS after the event set is created
 *   cuda_init CODE                    cuInit's CUresult (default 0)
 *   cuda_init_ms N                    cuInit takes N ms (as the real one takes ~0.5 s)
 *   cuda_peer A|* B|* 0|1             cuDeviceCanAccessPeer (default: NVML read == OK)
 *   cuda_bw A|* B|* GBPS              peer copy speed A -> B for the bench (default 400)
 *   cuda_corrupt A B                  peer copies A -> B flip a byte in the middle
 *
 * Later lines override earlier ones, so wildcards come first.
 */
#ifndef FAKE_SCENARIO_H
#define FAKE_SCENARIO_H

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_GPUS 16
#define MAX_LINKS 18
#define MAX_RULES 64

struct fake_link {
    int present, state, version, remote_gpu, type; /* type: 0 gpu, 2 switch */
    char remote[32];
};

struct fake_gpu {
    char bus[32], uuid[96], name[96], cpus[128];
    int cc_major, cc_minor, numa, speed, pcie_gen, pcie_width, fabric_state, fabric_status, recovery;
    unsigned char cluster_uuid[16];
    unsigned clique;
    unsigned long long ecc;
    unsigned remap[4];
    unsigned long long nvlink_errors[3];
    unsigned long long mem_mib;
    struct fake_link links[MAX_LINKS];
};

struct fake_scenario {
    int loaded, nvml_init, cuda_init, cuda_init_ms, cuda_version, ngpus;
    char driver[64];
    struct fake_gpu gpus[MAX_GPUS];
    int p2p[MAX_GPUS][MAX_GPUS][5];
    int topo[MAX_GPUS][MAX_GPUS];
    int peer[MAX_GPUS][MAX_GPUS]; /* -1: derive from p2p read */
    double bw[MAX_GPUS][MAX_GPUS];
    int corrupt[MAX_GPUS][MAX_GPUS];
    char fail_sym[MAX_RULES][64];
    int fail_rc[MAX_RULES], nfail;
    char hang_sym[MAX_RULES][64];
    int nhang;
    int refused_fields[MAX_RULES], nrefused;
    int xid_gpu[MAX_RULES], xid_ms[MAX_RULES], nxid;
    unsigned long long xid_code[MAX_RULES];
};

static struct fake_scenario S;
static pthread_once_t S_once = PTHREAD_ONCE_INIT;

static int code_of(const char *word) {
    static const struct { const char *name; int code; } names[] = {
        {"SUCCESS", 0}, {"UNINITIALIZED", 1}, {"INVALID_ARGUMENT", 2}, {"NOT_SUPPORTED", 3},
        {"NO_PERMISSION", 4}, {"NOT_FOUND", 6}, {"DRIVER_NOT_LOADED", 9}, {"TIMEOUT", 10},
        {"GPU_IS_LOST", 15}, {"LIB_RM_VERSION_MISMATCH", 18}, {"UNKNOWN", 999},
        {"OK", 0}, {"CNS", 1}, {"GNS", 2}, {"TNS", 3}, {"DISABLED", 4}, {"NS", 5}, {"U", 6},
        {"INTERNAL", 0}, {"SINGLE", 10}, {"MULTIPLE", 20}, {"HOSTBRIDGE", 30}, {"NODE", 40}, {"SYSTEM", 50},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(word, names[i].name) == 0) return names[i].code;
    return atoi(word);
}

/* Calls f(i) for a GPU index or '*' (every GPU). */
#define EACH(word, i, body) do { \
    for (int i = 0; i < S.ngpus; i++) { if (strcmp((word), "*") == 0 || atoi(word) == i) { body; } } \
} while (0)

static void load_scenario(void) {
    memset(&S, 0, sizeof S);
    strcpy(S.driver, "535.104.05");
    S.cuda_version = 12020;
    for (int a = 0; a < MAX_GPUS; a++)
        for (int b = 0; b < MAX_GPUS; b++) { S.peer[a][b] = -1; S.bw[a][b] = 400; S.topo[a][b] = 50; for (int k = 0; k < 5; k++) S.p2p[a][b][k] = 5; }
    const char *path = getenv("FAKE_GPU_SCENARIO");
#ifdef FAKE_GPU_SCENARIO_FILE
    /* Unit tests load the fake into their own process, where setting the
     * environment would race the other test threads: the path is built in. */
    if (!path) path = FAKE_GPU_SCENARIO_FILE;
#endif
    FILE *f = path ? fopen(path, "r") : NULL;
    if (!f) { fprintf(stderr, "fake NVIDIA library: FAKE_GPU_SCENARIO unset or unreadable\n"); S.loaded = 1; return; }
    char line[512];
    while (fgets(line, sizeof line, f)) {
        char *hash = strchr(line, '#'); if (hash) *hash = 0;
        char w[8][96] = {{0}}; int n = sscanf(line, "%95s %95s %95s %95s %95s %95s %95s %95s", w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]);
        if (n <= 0) continue;
        if (!strcmp(w[0], "nvml_init")) S.nvml_init = code_of(w[1]);
        else if (!strcmp(w[0], "driver")) snprintf(S.driver, sizeof S.driver, "%s", w[1]);
        else if (!strcmp(w[0], "cuda_version")) S.cuda_version = atoi(w[1]);
        else if (!strcmp(w[0], "cuda_init")) S.cuda_init = atoi(w[1]);
        else if (!strcmp(w[0], "cuda_init_ms")) S.cuda_init_ms = atoi(w[1]);
        else if (!strcmp(w[0], "gpu") && S.ngpus < MAX_GPUS) {
            struct fake_gpu *g = &S.gpus[S.ngpus++];
            snprintf(g->bus, sizeof g->bus, "%s", w[1]);
            sscanf(w[2], "%d.%d", &g->cc_major, &g->cc_minor);
            g->mem_mib = strtoull(w[3], NULL, 10);
            g->numa = atoi(w[4]);
            snprintf(g->cpus, sizeof g->cpus, "%s", w[5]);
            snprintf(g->uuid, sizeof g->uuid, "%s", w[6]);
            /* The name is the rest of the line after the seventh word. */
            const char *p = line; for (int k = 0; k < 7; k++) { while (*p == ' ' || *p == '\t') p++; while (*p && *p != ' ' && *p != '\t') p++; }
            while (*p == ' ' || *p == '\t') p++;
            snprintf(g->name, sizeof g->name, "%s", p);
            g->name[strcspn(g->name, "\r\n")] = 0;
            g->speed = -1; g->pcie_gen = 4; g->pcie_width = 16; g->fabric_state = -1; g->recovery = -1;
        } else if (!strcmp(w[0], "link")) {
            int first = 0, last = 0; sscanf(w[2], "%d-%d", &first, &last); if (last < first) last = first;
            EACH(w[1], i, {
                for (int l = first; l <= last && l < MAX_LINKS; l++) {
                    struct fake_link *k = &S.gpus[i].links[l];
                    k->present = 1; k->state = atoi(w[3]); k->version = atoi(w[4]);
                    k->remote_gpu = -1;
                    if (!strncmp(w[5], "gpu", 3)) k->remote_gpu = atoi(w[5] + 3);
                    else snprintf(k->remote, sizeof k->remote, "%s", w[5]);
                    k->type = strcmp(w[6], "switch") == 0 ? 2 : 0;
                }
            });
        } else if (!strcmp(w[0], "speed")) { EACH(w[1], i, S.gpus[i].speed = atoi(w[2])); }
        else if (!strcmp(w[0], "ecc")) { EACH(w[1], i, S.gpus[i].ecc = strtoull(w[2], NULL, 10)); }
        else if (!strcmp(w[0], "recovery")) { EACH(w[1], i, S.gpus[i].recovery = atoi(w[2])); }
        else if (!strcmp(w[0], "remap")) { EACH(w[1], i, for (int k = 0; k < 4; k++) S.gpus[i].remap[k] = (unsigned)atoi(w[2 + k])); }
        else if (!strcmp(w[0], "nvlink_errors")) { EACH(w[1], i, for (int k = 0; k < 3; k++) S.gpus[i].nvlink_errors[k] = strtoull(w[2 + k], NULL, 10)); }
        else if (!strcmp(w[0], "xid") && S.nxid < MAX_RULES) {
            S.xid_gpu[S.nxid] = atoi(w[1]); S.xid_code[S.nxid] = strtoull(w[2], NULL, 10); S.xid_ms[S.nxid++] = atoi(w[3]);
        }
        else if (!strcmp(w[0], "fabric")) {
            unsigned char uuid[16] = {0}; int k = 0;
            for (const char *c = w[4]; *c && k < 32; c++) {
                int v = (*c >= '0' && *c <= '9') ? *c - '0' : (*c >= 'a' && *c <= 'f') ? *c - 'a' + 10 : -1;
                if (v < 0) continue;
                uuid[k / 2] |= (unsigned char)(k % 2 ? v : v << 4); k++;
            }
            unsigned clique = (unsigned)strtoul(w[5], NULL, 0);
            EACH(w[1], i, { S.gpus[i].fabric_state = atoi(w[2]); S.gpus[i].fabric_status = code_of(w[3]);
                            memcpy(S.gpus[i].cluster_uuid, uuid, 16); S.gpus[i].clique = clique; });
        }
        else if (!strcmp(w[0], "pcie")) { EACH(w[1], i, { S.gpus[i].pcie_gen = atoi(w[2]); S.gpus[i].pcie_width = atoi(w[3]); }); }
        else if (!strcmp(w[0], "p2p")) {
            EACH(w[1], a, EACH(w[2], b, { if (a != b) for (int k = 0; k < 5; k++) S.p2p[a][b][k] = code_of(w[3 + k]); }));
        } else if (!strcmp(w[0], "topo")) { EACH(w[1], a, EACH(w[2], b, S.topo[a][b] = code_of(w[3]))); }
        else if (!strcmp(w[0], "cuda_bw")) { EACH(w[1], a, EACH(w[2], b, S.bw[a][b] = atof(w[3]))); }
        else if (!strcmp(w[0], "cuda_corrupt")) { EACH(w[1], a, EACH(w[2], b, S.corrupt[a][b] = 1)); }
        else if (!strcmp(w[0], "cuda_peer")) { EACH(w[1], a, EACH(w[2], b, S.peer[a][b] = atoi(w[3]))); }
        else if (!strcmp(w[0], "fail") && S.nfail < MAX_RULES) { snprintf(S.fail_sym[S.nfail], 64, "%s", w[1]); S.fail_rc[S.nfail++] = code_of(w[2]); }
        else if (!strcmp(w[0], "refuse_field") && S.nrefused < MAX_RULES) { S.refused_fields[S.nrefused++] = atoi(w[1]); }
        else if (!strcmp(w[0], "hang") && S.nhang < MAX_RULES) { snprintf(S.hang_sym[S.nhang++], 64, "%s", w[1]); }
    }
    fclose(f);
    S.loaded = 1;
}

static struct fake_scenario *scenario(void) {
    pthread_once(&S_once, load_scenario);
    return &S;
}

/* Applies `hang` and `fail` directives for `sym`; returns -1 when neither applies. */
static int injected(const char *sym) {
    scenario();
    for (int i = 0; i < S.nhang; i++)
        if (!strcmp(S.hang_sym[i], sym)) for (;;) pause();
    for (int i = 0; i < S.nfail; i++)
        if (!strcmp(S.fail_sym[i], sym)) return S.fail_rc[i];
    return -1;
}

#endif
