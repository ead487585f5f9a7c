/* The RSS floor for serve (scripts/gpu-acceptance-perf.sh, scripts/gpu-serve-rss.sh):
 * a process that only loads NVML and calls nvmlInit_v2, as nccl-preflight serve must
 * at least do. Build: cc -O2 -o nvml_init_rss nvml_init_rss.c -ldl
 *
 *   nvml_init_rss             VmRSS in kB before and after nvmlInit_v2.
 *   nvml_init_rss hold S      the same, then stays S seconds so that another process
 *                             can read its /proc/PID/smaps and maps.
 *   nvml_init_rss steps       after loading NVML, after nvmlInit_v2 and after each of
 *                             the NVML calls serve makes (on GPU 0, and GPUs 0-1 for the
 *                             pair calls): VmRSS and whether libcuda is mapped, so the
 *                             call that makes libnvidia-ml load libcuda is named.
 * Library: $NVML_LIB, default libnvidia-ml.so.1 (through the loader's search path). */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static long rss_kb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6)) sscanf(line + 6, "%ld", &kb);
    if (f) fclose(f);
    return kb;
}

/* Whether any mapping of this process is a file named libcuda*. */
static int libcuda_mapped(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    char line[4096];
    int found = 0;
    while (f && fgets(line, sizeof line, f))
        if (strstr(line, "/libcuda")) found = 1;
    if (f) fclose(f);
    return found;
}

static void *lib;
static void *sym(const char *name) { return dlsym(lib, name); }

static void step(const char *call, int rc) {
    printf("%-44s rc %-4d VmRSS %6ld kB  libcuda %s\n", call, rc, rss_kb(),
           libcuda_mapped() ? "mapped" : "not mapped");
    fflush(stdout);
}

typedef int (*f_void)(void);
typedef int (*f_uint_p)(unsigned *);
typedef int (*f_int_p)(int *);
typedef int (*f_str)(char *, unsigned);
typedef int (*f_handle)(unsigned, void **);
typedef int (*f_dev_str)(void *, char *, unsigned);
typedef int (*f_dev_buf)(void *, void *);
typedef int (*f_dev_int_int)(void *, int *, int *);
typedef int (*f_p2p)(void *, void *, int, int *);
typedef int (*f_link)(void *, unsigned, int *);
typedef int (*f_set)(void **);

/* Each call serve's checks make, in its order (src/gather/gpu/nvml.rs, src/serve/xid.rs);
 * a symbol this driver lacks is skipped. Buffers are larger than NVML's structures. */
static void steps(void) {
    char buf[4096];
    unsigned count = 0;
    int a = 0, b = 0;
    void *dev[2] = {0, 0}, *set = 0;
    f_uint_p count_fn = (f_uint_p)sym("nvmlDeviceGetCount_v2");
    if (count_fn) step("nvmlDeviceGetCount_v2", count_fn(&count));
    f_handle handle = (f_handle)sym("nvmlDeviceGetHandleByIndex_v2");
    for (unsigned i = 0; handle && i < 2 && i < count; i++) {
        char name[64];
        snprintf(name, sizeof name, "nvmlDeviceGetHandleByIndex_v2(%u)", i);
        step(name, handle(i, &dev[i]));
    }
    if (!dev[0]) return;
    f_dev_str s;
    if ((s = (f_dev_str)sym("nvmlDeviceGetName"))) step("nvmlDeviceGetName", s(dev[0], buf, 96));
    if ((s = (f_dev_str)sym("nvmlDeviceGetUUID"))) step("nvmlDeviceGetUUID", s(dev[0], buf, 96));
    f_dev_buf d;
    if ((d = (f_dev_buf)sym("nvmlDeviceGetPciInfo_v3"))) step("nvmlDeviceGetPciInfo_v3", d(dev[0], buf));
    f_dev_int_int cc = (f_dev_int_int)sym("nvmlDeviceGetCudaComputeCapability");
    if (cc) step("nvmlDeviceGetCudaComputeCapability", cc(dev[0], &a, &b));
    if ((d = (f_dev_buf)sym("nvmlDeviceGetPersistenceMode"))) step("nvmlDeviceGetPersistenceMode", d(dev[0], buf));
    if ((d = (f_dev_buf)sym("nvmlDeviceGetGpuFabricInfo"))) step("nvmlDeviceGetGpuFabricInfo", d(dev[0], buf));
    f_link link = (f_link)sym("nvmlDeviceGetNvLinkState");
    if (link) step("nvmlDeviceGetNvLinkState(link 0)", link(dev[0], 0, &a));
    f_p2p p2p = (f_p2p)sym("nvmlDeviceGetP2PStatus");
    if (p2p && dev[1]) step("nvmlDeviceGetP2PStatus(0, 1, read)", p2p(dev[0], dev[1], 0, &a));
    f_str str = (f_str)sym("nvmlSystemGetDriverVersion");
    if (str) step("nvmlSystemGetDriverVersion", str(buf, 80));
    f_int_p cuda = (f_int_p)sym("nvmlSystemGetCudaDriverVersion_v2");
    if (cuda) step("nvmlSystemGetCudaDriverVersion_v2", cuda(&a));
    f_set create = (f_set)sym("nvmlEventSetCreate");
    if (create) step("nvmlEventSetCreate", create(&set));
}

int main(int argc, char **argv) {
    const char *path = getenv("NVML_LIB") ? getenv("NVML_LIB") : "libnvidia-ml.so.1";
    int stepping = argc > 1 && !strcmp(argv[1], "steps");
    long before = rss_kb();
    lib = dlopen(path, RTLD_NOW);
    if (!lib) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 2; }
    if (stepping) step("dlopen(libnvidia-ml.so.1)", 0);
    f_void init = (f_void)sym("nvmlInit_v2");
    int rc = init ? init() : -1;
    if (stepping) step("nvmlInit_v2", rc);
    if (rc != 0) { fprintf(stderr, "nvmlInit_v2 failed: %d\n", rc); return 2; }
    if (stepping) { steps(); return 0; }
    printf("rss_before_kb %ld\nrss_after_nvmlInit_kb %ld\n", before, rss_kb());
    fflush(stdout);
    if (argc > 2 && !strcmp(argv[1], "hold")) sleep((unsigned)atoi(argv[2]));
    return 0;
}
