/* A fake libnvidia-ml.so.1 for tests: answers the NVML calls nccl-preflight
 * makes from a scenario file (see scenario.h). Signatures and struct layouts
 * follow nvml.h. */
#include "scenario.h"

typedef int nvmlReturn_t;
typedef struct fake_gpu *nvmlDevice_t;

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;

typedef union { double dVal; int siVal; unsigned int uiVal; unsigned long ulVal; unsigned long long ullVal; long long sllVal; unsigned short usVal; } nvmlValue_t;
typedef struct {
    unsigned int fieldId, scopeId;
    long long timestamp, latencyUsec;
    int valueType;
    nvmlReturn_t nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;

#define GUARD(sym) do { int rc_ = injected(sym); if (rc_ >= 0) return rc_; } while (0)
#define DEV_INDEX(d) ((int)((d) - S.gpus))
#define CHECK_DEV(d) do { if (!(d) || DEV_INDEX(d) < 0 || DEV_INDEX(d) >= S.ngpus) return 2; } while (0)

static int initialised;

nvmlReturn_t nvmlInit_v2(void) { GUARD("nvmlInit_v2"); if (scenario()->nvml_init) return S.nvml_init; initialised = 1; return 0; }
nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { (void)flags; return nvmlInit_v2(); }
nvmlReturn_t nvmlShutdown(void) { initialised = 0; return 0; }
const char *nvmlErrorString(nvmlReturn_t rc) {
    switch (rc) {
    case 0: return "Success"; case 2: return "Invalid Argument"; case 3: return "Not Supported";
    case 9: return "Driver Not Loaded"; case 15: return "GPU is lost"; default: return "Unknown Error";
    }
}

static nvmlReturn_t copy_string(const char *s, char *out, unsigned int len) {
    if (!out || strlen(s) + 1 > len) return 7; /* INSUFFICIENT_SIZE */
    strcpy(out, s);
    return 0;
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *v, unsigned int len) { GUARD("nvmlSystemGetDriverVersion"); return copy_string(scenario()->driver, v, len); }
nvmlReturn_t nvmlSystemGetNVMLVersion(char *v, unsigned int len) { GUARD("nvmlSystemGetNVMLVersion"); return copy_string("12.535.104.05", v, len); }
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { GUARD("nvmlSystemGetCudaDriverVersion_v2"); *v = scenario()->cuda_version; return 0; }
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) { GUARD("nvmlDeviceGetCount_v2"); if (!initialised) return 1; *n = (unsigned)scenario()->ngpus; return 0; }
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) {
    GUARD("nvmlDeviceGetHandleByIndex_v2");
    if (i >= (unsigned)scenario()->ngpus) return 2;
    *d = &S.gpus[i];
    return 0;
}
nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *i) { GUARD("nvmlDeviceGetIndex"); CHECK_DEV(d); *i = (unsigned)DEV_INDEX(d); return 0; }
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *out, unsigned int len) { GUARD("nvmlDeviceGetName"); CHECK_DEV(d); return copy_string(d->name, out, len); }
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *out, unsigned int len) { GUARD("nvmlDeviceGetUUID"); CHECK_DEV(d); return copy_string(d->uuid, out, len); }

/* NVML's busId has an 8-digit domain and upper-case hex: 00000000:10:1C.0. */
static void fill_pci(const char *bus, nvmlPciInfo_t *p) {
    unsigned dom = 0, b = 0, dev = 0, fn = 0;
    memset(p, 0, sizeof *p);
    sscanf(bus, "%x:%x:%x.%x", &dom, &b, &dev, &fn);
    p->domain = dom; p->bus = b; p->device = dev; p->pciDeviceId = 0x20b010de;
    snprintf(p->busId, sizeof p->busId, "%08X:%02X:%02X.%X", dom, b, dev, fn);
    snprintf(p->busIdLegacy, sizeof p->busIdLegacy, "%04X:%02X:%02X.%X", dom, b, dev, fn);
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *p) { GUARD("nvmlDeviceGetPciInfo_v3"); CHECK_DEV(d); fill_pci(d->bus, p); return 0; }
nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t d, int *major, int *minor) { GUARD("nvmlDeviceGetCudaComputeCapability"); CHECK_DEV(d); *major = d->cc_major; *minor = d->cc_minor; return 0; }
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
    GUARD("nvmlDeviceGetMemoryInfo_v2"); CHECK_DEV(d);
    m->total = d->mem_mib << 20; m->reserved = 0; m->used = 0; m->free = m->total;
    return 0;
}
nvmlReturn_t nvmlDeviceGetMemoryAffinity(nvmlDevice_t d, unsigned int size, unsigned long *set, int scope) {
    GUARD("nvmlDeviceGetMemoryAffinity"); CHECK_DEV(d);
    if (d->numa < 0) return 3;
    memset(set, 0, size * sizeof *set);
    if ((unsigned)(d->numa / 64) < size) set[d->numa / 64] |= 1UL << (d->numa % 64);
    (void)scope; return 0;
}
nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t d, unsigned int *n) { GUARD("nvmlDeviceGetNumaNodeId"); CHECK_DEV(d); if (d->numa < 0) return 3; *n = (unsigned)d->numa; return 0; }
nvmlReturn_t nvmlDeviceGetCpuAffinity(nvmlDevice_t d, unsigned int size, unsigned long *set) {
    GUARD("nvmlDeviceGetCpuAffinity"); CHECK_DEV(d);
    memset(set, 0, size * sizeof *set);
    /* CPUS is a list of ranges: 0-47,96-143 */
    char buf[128]; snprintf(buf, sizeof buf, "%s", d->cpus);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        int a = 0, b = -1; if (sscanf(tok, "%d-%d", &a, &b) < 2) b = a;
        for (int c = a; c <= b; c++) if ((unsigned)(c / 64) < size) set[c / 64] |= 1UL << (c % 64);
    }
    return 0;
}
nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t d, int *mode) { GUARD("nvmlDeviceGetPersistenceMode"); CHECK_DEV(d); *mode = 1; return 0; }
nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *cur, unsigned int *pend) { GUARD("nvmlDeviceGetMigMode"); CHECK_DEV(d); *cur = 0; *pend = 0; return 0; }
nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t d, unsigned int *g) { GUARD("nvmlDeviceGetMaxPcieLinkGeneration"); CHECK_DEV(d); *g = (unsigned)d->pcie_gen; return 0; }
nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t d, unsigned int *w) { GUARD("nvmlDeviceGetMaxPcieLinkWidth"); CHECK_DEV(d); *w = (unsigned)d->pcie_width; return 0; }

static struct fake_link *link_of(nvmlDevice_t d, unsigned int link);

static int field_refused(unsigned int field) {
    for (int i = 0; i < S.nrefused; i++) if ((unsigned)S.refused_fields[i] == field) return 1;
    return 0;
}

/* Per-entry answers as the real driver gives them (nvml.h NVML_FI_*): a value with its
 * type, or NOT_SUPPORTED (3) for a field this fake does not know, one the scenario
 * refuses, or a link the GPU does not have. */
static void field_value(nvmlDevice_t d, nvmlFieldValue_t *v) {
    unsigned long long out = 0;
    int ok = 1;
    struct fake_link *l = link_of(d, v->scopeId);
    int switches = 0;
    for (int k = 0; k < MAX_LINKS; k++)
        if (d->links[k].present && d->links[k].type == 2) switches++;
    switch (v->fieldId) {
    case 4: out = d->ecc; break;                                   /* ECC_DBE_VOL_TOTAL */
    case 90: ok = d->speed >= 0; out = (unsigned)d->speed; break;  /* NVLINK_SPEED_MBPS_COMMON */
    case 142: case 143: case 144: case 145: out = d->remap[v->fieldId - 142]; break; /* REMAPPED_* */
    case 147: out = (unsigned)switches; break;                     /* NVSWITCH_CONNECTED_LINK_COUNT */
    /* NVLINK_ERROR_DL_REPLAY, _RECOVERY, _CRC (which counts CRC flit errors: 0 here, as
     * on the H200, where the scripted CRC count is the per-call CRC data counter). */
    case 161: ok = l != NULL; out = d->nvlink_errors[0]; break;
    case 162: ok = l != NULL; out = d->nvlink_errors[1]; break;
    case 163: ok = l != NULL; out = 0; break;
    case 164: ok = l != NULL && d->speed >= 0; out = (unsigned)d->speed; break; /* NVLINK_GET_SPEED */
    case 165: ok = l != NULL; if (l) out = (unsigned)l->state; break;          /* NVLINK_GET_STATE */
    case 166: ok = l != NULL; if (l) out = (unsigned)l->version; break;        /* NVLINK_GET_VERSION */
    case 230: ok = d->recovery >= 0; out = (unsigned)d->recovery; break;        /* GPU_RECOVERY_ACTION */
    default: ok = 0;
    }
    if (!ok || field_refused(v->fieldId)) { v->nvmlReturn = 3; return; }
    v->nvmlReturn = 0;
    v->valueType = 3; /* NVML_VALUE_TYPE_UNSIGNED_LONG_LONG */
    v->value.ullVal = out;
}

nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t d, int count, nvmlFieldValue_t *values) {
    GUARD("nvmlDeviceGetFieldValues"); CHECK_DEV(d);
    if (count < 0 || !values) return 2;
    for (int i = 0; i < count; i++) field_value(d, &values[i]);
    return 0;
}

static struct fake_link *link_of(nvmlDevice_t d, unsigned int link) {
    if (link >= MAX_LINKS || !d->links[link].present) return NULL;
    return &d->links[link];
}

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t d, unsigned int link, int *active) {
    GUARD("nvmlDeviceGetNvLinkState"); CHECK_DEV(d);
    struct fake_link *l = link_of(d, link); if (!l) return 3;
    *active = l->state; return 0;
}
nvmlReturn_t nvmlDeviceGetNvLinkVersion(nvmlDevice_t d, unsigned int link, unsigned int *v) {
    GUARD("nvmlDeviceGetNvLinkVersion"); CHECK_DEV(d);
    struct fake_link *l = link_of(d, link); if (!l) return 3;
    *v = (unsigned)l->version; return 0;
}
nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t d, unsigned int link, nvmlPciInfo_t *p) {
    GUARD("nvmlDeviceGetNvLinkRemotePciInfo_v2"); CHECK_DEV(d);
    struct fake_link *l = link_of(d, link); if (!l) return 3;
    fill_pci(l->remote_gpu >= 0 && l->remote_gpu < S.ngpus ? S.gpus[l->remote_gpu].bus : l->remote, p);
    return 0;
}
nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t d, unsigned int link, unsigned int *type) {
    GUARD("nvmlDeviceGetNvLinkRemoteDeviceType"); CHECK_DEV(d);
    struct fake_link *l = link_of(d, link); if (!l) return 3;
    *type = (unsigned)l->type; return 0;
}
nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t a, nvmlDevice_t b, int *level) {
    GUARD("nvmlDeviceGetTopologyCommonAncestor"); CHECK_DEV(a); CHECK_DEV(b);
    *level = a == b ? 0 : S.topo[DEV_INDEX(a)][DEV_INDEX(b)]; return 0;
}
/* FAKE_NVML_P2P_LOG names a file that gets a line "PID" per P2P status read: which
 * processes do the gathering. */
static void log_p2p(void) {
    const char *path = getenv("FAKE_NVML_P2P_LOG");
    if (!path) return;
    FILE *f = fopen(path, "a");
    if (f) { fprintf(f, "%d\n", (int)getpid()); fclose(f); }
}

nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t a, nvmlDevice_t b, int index, int *status) {
    GUARD("nvmlDeviceGetP2PStatus"); CHECK_DEV(a); CHECK_DEV(b);
    log_p2p();
    if (index < 0 || index > 4) return 2;
    *status = S.p2p[DEV_INDEX(a)][DEV_INDEX(b)][index]; return 0;
}

typedef struct { unsigned char clusterUuid[16]; nvmlReturn_t status; unsigned int cliqueId; unsigned char state; } nvmlGpuFabricInfo_t;

nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t d, nvmlGpuFabricInfo_t *info) {
    GUARD("nvmlDeviceGetGpuFabricInfo"); CHECK_DEV(d);
    if (d->fabric_state < 0) return 3; /* pre-Hopper: NOT_SUPPORTED */
    memset(info, 0, sizeof *info);
    info->state = (unsigned char)d->fabric_state;
    info->status = d->fabric_status;
    memcpy(info->clusterUuid, d->cluster_uuid, 16);
    info->cliqueId = d->clique;
    return 0;
}

/* Memory and link health. */
nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t d, int type, int counter, unsigned long long *count) {
    GUARD("nvmlDeviceGetTotalEccErrors"); CHECK_DEV(d);
    /* Only uncorrected (1) volatile (0) counts are scripted; corrected ones are 0. */
    *count = (type == 1 && counter == 0) ? d->ecc : 0; return 0;
}
nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t d, unsigned *corr, unsigned *unc, unsigned *pending, unsigned *failure) {
    GUARD("nvmlDeviceGetRemappedRows"); CHECK_DEV(d);
    *corr = d->remap[0]; *unc = d->remap[1]; *pending = d->remap[2]; *failure = d->remap[3]; return 0;
}
nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t d, int *pending) {
    GUARD("nvmlDeviceGetRetiredPagesPendingStatus"); CHECK_DEV(d); *pending = 0; return 0;
}
/* Counters 0 replay, 1 recovery, 2 crc_flit, 3 crc_data (the scripted CRC count). */
nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t d, unsigned int link, int counter, unsigned long long *value) {
    GUARD("nvmlDeviceGetNvLinkErrorCounter"); CHECK_DEV(d);
    if (!link_of(d, link)) return 2;
    if (counter < 0 || counter > 3) return 2;
    *value = counter == 3 ? d->nvlink_errors[2] : counter == 2 ? 0 : d->nvlink_errors[counter];
    return 0;
}

/* Critical XID events: one event set; each `xid` directive fires once, AFTER_MS
 * after the set was created. Waits sleep in small steps up to their timeout. */
#include <time.h>
typedef struct { nvmlDevice_t device; unsigned long long eventType, eventData; unsigned int gpuInstanceId, computeInstanceId; } nvmlEventData_t;
struct fake_event_set { double created_ms; int fired[MAX_RULES]; unsigned long long types[MAX_GPUS]; };
static double now_ms(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e3 + t.tv_nsec / 1e6; }
nvmlReturn_t nvmlEventSetCreate(struct fake_event_set **set) {
    GUARD("nvmlEventSetCreate");
    *set = calloc(1, sizeof **set); (*set)->created_ms = now_ms(); return 0;
}
nvmlReturn_t nvmlEventSetFree(struct fake_event_set *set) { free(set); return 0; }
nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t d, unsigned long long *types) {
    GUARD("nvmlDeviceGetSupportedEventTypes"); CHECK_DEV(d); *types = 0x8; return 0;
}
nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types, struct fake_event_set *set) {
    GUARD("nvmlDeviceRegisterEvents"); CHECK_DEV(d);
    set->types[DEV_INDEX(d)] |= types; return 0;
}
nvmlReturn_t nvmlEventSetWait_v2(struct fake_event_set *set, nvmlEventData_t *data, unsigned int timeout_ms) {
    GUARD("nvmlEventSetWait_v2");
    double until = now_ms() + timeout_ms;
    for (;;) {
        for (int i = 0; i < S.nxid; i++) {
            int g = S.xid_gpu[i];
            if (set->fired[i] || g < 0 || g >= S.ngpus || !(set->types[g] & 0x8)) continue;
            if (now_ms() - set->created_ms >= S.xid_ms[i]) {
                set->fired[i] = 1;
                memset(data, 0, sizeof *data);
                data->device = &S.gpus[g]; data->eventType = 0x8; data->eventData = S.xid_code[i];
                return 0;
            }
        }
        if (now_ms() >= until) return 10; /* NVML_ERROR_TIMEOUT */
        usleep(5000);
    }
}
