/* A fake libibverbs.so.1 for tests: the verbs calls nccl-preflight makes,
 * answered from FAKE_VERBS_SCENARIO (one directive per line, '#' comments):
 *
 *   device NAME PORTS STATE LINK      STATE: ACTIVE DOWN INIT; LINK: IB ETH UNSPEC
 *   open_fail NAME ERRNO              ibv_open_device fails for NAME with ERRNO
 *   nosys                             ibv_get_device_list fails with ENOSYS
 *   hang NAME                         ibv_open_device never returns for NAME
 *
 * ibv_reg_mr behaves like the kernel: above RLIMIT_MEMLOCK it fails with ENOMEM
 * unless the process holds CAP_IPC_LOCK. Struct layouts follow infiniband/verbs.h. */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

struct ibv_device_attr {
    char fw_ver[64];
    uint64_t node_guid, sys_image_guid, max_mr_size, page_size_cap;
    uint32_t vendor_id, vendor_part_id, hw_ver;
    int max_qp, max_qp_wr;
    unsigned int device_cap_flags;
    int max_sge, max_sge_rd, max_cq, max_cqe, max_mr, max_pd, max_qp_rd_atom, max_ee_rd_atom, max_res_rd_atom,
        max_qp_init_rd_atom, max_ee_init_rd_atom;
    int atomic_cap;
    int max_ee, max_rdd, max_mw, max_raw_ipv6_qp, max_raw_ethy_qp, max_mcast_grp, max_mcast_qp_attach,
        max_total_mcast_qp_attach, max_ah, max_fmr, max_map_per_fmr, max_srq, max_srq_wr, max_srq_sge;
    uint16_t max_pkeys;
    uint8_t local_ca_ack_delay, phys_port_cnt;
};

struct ibv_port_attr {
    int state, max_mtu, active_mtu, gid_tbl_len;
    uint32_t port_cap_flags, max_msg_sz, bad_pkey_cntr, qkey_viol_cntr;
    uint16_t pkey_tbl_len, lid, sm_lid;
    uint8_t lmc, max_vl_num, sm_sl, subnet_timeout, init_type_reply, active_width, active_speed, phys_state, link_layer, flags;
    uint16_t port_cap_flags2;
};

struct fake_device { char name[64]; int ports, state, link, open_errno, hang; };
struct ibv_context { struct fake_device *dev; };
struct ibv_pd { struct ibv_context *ctx; };
struct ibv_mr { size_t length; };

static struct fake_device devices[256];
static struct fake_device *list[257];
static int ndevices, nosys;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void load(void) {
    const char *path = getenv("FAKE_VERBS_SCENARIO");
    FILE *f = path ? fopen(path, "r") : NULL;
    if (!f) return;
    char line[256];
    while (fgets(line, sizeof line, f)) {
        char *hash = strchr(line, '#'); if (hash) *hash = 0;
        char w[5][64] = {{0}};
        int n = sscanf(line, "%63s %63s %63s %63s %63s", w[0], w[1], w[2], w[3], w[4]);
        if (n <= 0) continue;
        if (!strcmp(w[0], "nosys")) nosys = 1;
        else if (!strcmp(w[0], "device") && ndevices < 256) {
            struct fake_device *d = &devices[ndevices++];
            snprintf(d->name, sizeof d->name, "%s", w[1]);
            d->ports = atoi(w[2]);
            d->state = !strcmp(w[3], "ACTIVE") ? 4 : !strcmp(w[3], "INIT") ? 2 : 1;
            d->link = !strcmp(w[4], "IB") ? 1 : !strcmp(w[4], "ETH") ? 2 : 0;
        } else if (!strcmp(w[0], "hang")) {
            for (int i = 0; i < ndevices; i++) if (!strcmp(devices[i].name, w[1])) devices[i].hang = 1;
        } else if (!strcmp(w[0], "open_fail")) {
            for (int i = 0; i < ndevices; i++) if (!strcmp(devices[i].name, w[1])) devices[i].open_errno = atoi(w[2]);
        }
    }
    fclose(f);
}

struct fake_device **ibv_get_device_list(int *num) {
    pthread_once(&once, load);
    if (nosys) { errno = ENOSYS; return NULL; }
    for (int i = 0; i < ndevices; i++) list[i] = &devices[i];
    list[ndevices] = NULL;
    if (num) *num = ndevices;
    return list;
}
void ibv_free_device_list(struct fake_device **l) { (void)l; }
const char *ibv_get_device_name(struct fake_device *d) { return d->name; }

struct ibv_context *ibv_open_device(struct fake_device *d) {
    while (d->hang) pause();
    if (d->open_errno) { errno = d->open_errno; return NULL; }
    struct ibv_context *c = calloc(1, sizeof *c);
    c->dev = d;
    return c;
}
int ibv_close_device(struct ibv_context *c) { free(c); return 0; }

int ibv_query_device(struct ibv_context *c, struct ibv_device_attr *a) {
    memset(a, 0, sizeof *a);
    snprintf(a->fw_ver, sizeof a->fw_ver, "fake-1.0");
    a->vendor_id = 0x1d0f;
    a->vendor_part_id = 0xefa1;
    a->phys_port_cnt = (uint8_t)c->dev->ports;
    return 0;
}

int ibv_query_port(struct ibv_context *c, uint8_t port, struct ibv_port_attr *a) {
    if (port < 1 || port > c->dev->ports) return EINVAL;
    memset(a, 0, 40); /* the compat prefix: every field through link_layer */
    a->state = c->dev->state;
    a->active_mtu = 5;
    a->link_layer = (uint8_t)c->dev->link;
    a->phys_state = c->dev->state == 4 ? 5 : 3;
    return 0;
}

struct ibv_pd *ibv_alloc_pd(struct ibv_context *c) { struct ibv_pd *p = calloc(1, sizeof *p); p->ctx = c; return p; }
int ibv_dealloc_pd(struct ibv_pd *p) { free(p); return 0; }

static int has_ipc_lock(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256]; unsigned long long eff = 0;
    if (!f) return 0;
    while (fgets(line, sizeof line, f)) if (!strncmp(line, "CapEff:", 7)) eff = strtoull(line + 7, NULL, 16);
    fclose(f);
    return (eff >> 14) & 1; /* CAP_IPC_LOCK */
}

struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access) {
    (void)pd; (void)addr; (void)access;
    struct rlimit r;
    if (getrlimit(RLIMIT_MEMLOCK, &r) == 0 && r.rlim_cur != RLIM_INFINITY && length > r.rlim_cur && !has_ipc_lock()) {
        errno = ENOMEM;
        return NULL;
    }
    struct ibv_mr *m = calloc(1, sizeof *m);
    m->length = length;
    return m;
}
int ibv_dereg_mr(struct ibv_mr *m) { free(m); return 0; }
