/* Fakes for tests, one source: built with -DFAKE_LIBNCCL it is libnccl.so.2
 * (ncclGetVersion answers FAKE_NCCL_VERSION, default 22809); built with
 * -DFAKE_NET_PLUGIN it is an NCCL net plugin exporting ncclNetPlugin_v9 named
 * "Libfabric", as aws-ofi-nccl does. Nothing else is implemented: nccl-preflight
 * never initialises either. */
#include <stdlib.h>

#ifdef FAKE_LIBNCCL
int ncclGetVersion(int *version) {
    const char *v = getenv("FAKE_NCCL_VERSION");
    *version = v ? atoi(v) : 22809;
    return 0;
}
#endif

#ifdef FAKE_NET_PLUGIN
struct fake_net { const char *name; void *init; };
const struct fake_net ncclNetPlugin_v9 = { "Libfabric", 0 };
#endif
