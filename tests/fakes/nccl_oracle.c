/* Drives a real libnccl.so.2 without a GPU (tests/integration/nccl_oracle.rs): dlopens
 * the library named by argv[1], prints ncclGetVersion's code, then runs one case per
 * block read from the file argv[2]. A block is `NAME=VALUE` lines ended by a line `--`; each case
 * runs in a forked child that sets those variables and calls ncclGetUniqueId, the
 * entry point that needs no CUDA device: it runs ncclInit (the environment, the
 * bootstrap interface, the net plugin; NVIDIA/nccl src/init.cc), once per process,
 * hence one child per case. What NCCL prints with NCCL_DEBUG=INFO goes to stdout as
 * NCCL writes it; this program's own lines start with "oracle:". Exit status: 0 when
 * every case ran, 3 when the library or a symbol could not be loaded. */
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef int (*get_version_fn)(int *);
/* ncclUniqueId is `struct { char internal[128]; }` (NCCL_UNIQUE_ID_BYTES, src/nccl.h.in). */
typedef int (*get_unique_id_fn)(void *);

#define MAX_VARS 16

static void run_case(int n, get_unique_id_fn get_unique_id, char vars[][4096], int nvars) {
  printf("oracle: case %d\n", n);
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) {
    printf("oracle: fork failed\n");
    return;
  }
  if (pid == 0) {
    for (int i = 0; i < nvars; i++) {
      char *eq = strchr(vars[i], '=');
      if (!eq) continue;
      *eq = '\0';
      setenv(vars[i], eq + 1, 1);
    }
    char id[128];
    memset(id, 0, sizeof id);
    int rc = get_unique_id(id);
    fflush(NULL);
    printf("oracle: unique id rc %d\n", rc);
    fflush(NULL);
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFSIGNALED(status)) printf("oracle: killed by signal %d\n", WTERMSIG(status));
  printf("oracle: end %d\n", n);
  fflush(stdout);
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s LIBNCCL CASES\n", argv[0]);
    return 2;
  }
  void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    printf("oracle: dlopen failed: %s\n", dlerror());
    return 3;
  }
  get_version_fn get_version = (get_version_fn)dlsym(lib, "ncclGetVersion");
  get_unique_id_fn get_unique_id = (get_unique_id_fn)dlsym(lib, "ncclGetUniqueId");
  if (!get_version || !get_unique_id) {
    printf("oracle: missing symbol\n");
    return 3;
  }
  int code = 0;
  int rc = get_version(&code);
  printf("oracle: version rc %d code %d\n", rc, code);
  FILE *cases = fopen(argv[2], "r");
  if (!cases) {
    printf("oracle: cannot open %s\n", argv[2]);
    return 2;
  }
  static char vars[MAX_VARS][4096];
  int nvars = 0, n = 0;
  char line[4096];
  while (fgets(line, sizeof line, cases)) {
    line[strcspn(line, "\n")] = '\0';
    if (strcmp(line, "--") == 0) {
      run_case(n++, get_unique_id, vars, nvars);
      nvars = 0;
    } else if (nvars < MAX_VARS) {
      snprintf(vars[nvars++], sizeof vars[0], "%s", line);
    }
  }
  return 0;
}
