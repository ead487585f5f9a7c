/* The RSS floor for serve (scripts/gpu-acceptance-perf.sh): a process that only
 * loads NVML and calls nvmlInit_v2, as nccl-preflight serve must at least do.
 * Prints VmRSS in kB before and after. Build: cc -O2 -o nvml_init_rss nvml_init_rss.c -ldl */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

static long rss_kb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6)) sscanf(line + 6, "%ld", &kb);
    if (f) fclose(f);
    return kb;
}

int main(void) {
    long before = rss_kb();
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!lib) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 2; }
    int (*init)(void) = (int (*)(void))dlsym(lib, "nvmlInit_v2");
    if (!init || init() != 0) { fprintf(stderr, "nvmlInit_v2 failed\n"); return 2; }
    printf("rss_before_kb %ld\nrss_after_nvmlInit_kb %ld\n", before, rss_kb());
    return 0;
}
