/* A fake libfabric.so.1 for tests: fi_version and fi_getinfo listing the
 * providers named in FAKE_FABRIC_SCENARIO ("version MAJOR MINOR" and one
 * "provider NAME" per line); efa appears only for RDM hints if listed.
 * Struct layouts follow rdma/fabric.h. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct fi_fabric_attr { void *fabric; char *name; char *prov_name; uint32_t prov_version, api_version; };
struct fi_ep_attr { int type; uint32_t protocol, protocol_version; size_t max_msg_size, msg_prefix_size,
    max_order_raw_size, max_order_war_size, max_order_waw_size; uint64_t mem_tag_format; size_t tx_ctx_cnt, rx_ctx_cnt, auth_key_size; uint8_t *auth_key; };
struct fi_info {
    struct fi_info *next; uint64_t caps, mode; uint32_t addr_format; size_t src_addrlen, dest_addrlen;
    void *src_addr, *dest_addr, *handle, *tx_attr, *rx_attr; struct fi_ep_attr *ep_attr; void *domain_attr;
    struct fi_fabric_attr *fabric_attr; void *nic;
};

static int major = 1, minor = 22, nprov;
static char providers[32][32];

static void load(void) {
    static int loaded;
    if (loaded++) return;
    const char *path = getenv("FAKE_FABRIC_SCENARIO");
    FILE *f = path ? fopen(path, "r") : NULL;
    if (!f) return;
    char a[32], b[32], c[32];
    char line[128];
    while (fgets(line, sizeof line, f)) {
        int n = sscanf(line, "%31s %31s %31s", a, b, c);
        if (n >= 3 && !strcmp(a, "version")) { major = atoi(b); minor = atoi(c); }
        else if (n >= 2 && !strcmp(a, "provider") && nprov < 32) snprintf(providers[nprov++], 32, "%s", b);
    }
    fclose(f);
}

uint32_t fi_version(void) { load(); return (uint32_t)(major << 16 | minor); }

struct fi_info *fi_dupinfo(const struct fi_info *src) {
    (void)src;
    struct fi_info *i = calloc(1, sizeof *i);
    i->ep_attr = calloc(1, sizeof *i->ep_attr);
    i->fabric_attr = calloc(1, sizeof *i->fabric_attr);
    return i;
}

void fi_freeinfo(struct fi_info *i) {
    while (i) {
        struct fi_info *next = i->next;
        if (i->fabric_attr) { free(i->fabric_attr->prov_name); free(i->fabric_attr); }
        free(i->ep_attr);
        free(i);
        i = next;
    }
}

int fi_getinfo(uint32_t version, const char *node, const char *service, uint64_t flags, const struct fi_info *hints, struct fi_info **out) {
    (void)version; (void)node; (void)service; (void)flags;
    load();
    const char *want = hints && hints->fabric_attr ? hints->fabric_attr->prov_name : NULL;
    struct fi_info *head = NULL;
    for (int p = nprov - 1; p >= 0; p--) {
        if (want && strcmp(want, providers[p])) continue;
        struct fi_info *i = fi_dupinfo(NULL);
        i->fabric_attr->prov_name = strdup(providers[p]);
        i->ep_attr->type = 3;
        i->next = head;
        head = i;
    }
    if (!head) return -61; /* -FI_ENODATA */
    *out = head;
    return 0;
}
