/* A net plugin for tests/integration/nccl_oracle.rs, named PLUGIN_NAME, exporting
 * ncclNetPlugin_vN for each -DEXPORT_VN given (none: a library without the symbol).
 * Real NCCL 2.13-2.23 dlopens its net plugin in ncclGetUniqueId and reads only the name
 * there (src/net.cc ncclNetPluginInit); the functions answer "no device" in case a
 * release calls them. */
#ifndef PLUGIN_NAME
#define PLUGIN_NAME "oracle"
#endif

__attribute__((unused)) static int ok(void) { return 0; }
__attribute__((unused)) static int no_devices(int *n) {
  *n = 0;
  return 0;
}

struct fake_net {
  const char *name;
  int (*init)(void);
  int (*devices)(int *);
  int (*rest[32])(void);
};

#define FAKE_NET                                                   \
  {                                                                \
    PLUGIN_NAME, ok, no_devices, {                                 \
      ok, ok, ok, ok, ok, ok, ok, ok, ok, ok, ok, ok, ok, ok, ok, ok, \
          ok, ok, ok, ok, ok, ok, ok, ok, ok, ok, ok, ok, ok, ok, ok, ok \
    }                                                              \
  }

#ifdef EXPORT_V4
const struct fake_net ncclNetPlugin_v4 = FAKE_NET;
#endif
#ifdef EXPORT_V5
const struct fake_net ncclNetPlugin_v5 = FAKE_NET;
#endif
#ifdef EXPORT_V6
const struct fake_net ncclNetPlugin_v6 = FAKE_NET;
#endif
#ifdef EXPORT_V7
const struct fake_net ncclNetPlugin_v7 = FAKE_NET;
#endif
#ifdef EXPORT_V8
const struct fake_net ncclNetPlugin_v8 = FAKE_NET;
#endif
#ifdef EXPORT_V9
const struct fake_net ncclNetPlugin_v9 = FAKE_NET;
#endif
/* Something to export when no API is. */
const char oracle_plugin_name[] = PLUGIN_NAME;
