/* A fake CUDA runtime (libcudart.so.N) for tests: cudaRuntimeGetVersion answers
 * FAKE_CUDART_VERSION (CUDA's encoding, 12080 = 12.8; default 12080), as the real
 * one answers the version it was built as. Nothing else of the runtime exists:
 * nccl-preflight calls nothing else. */
#include <stdlib.h>

int cudaRuntimeGetVersion(int *version) {
    const char *v = getenv("FAKE_CUDART_VERSION");
    *version = v ? atoi(v) : 12080;
    return 0;
}
