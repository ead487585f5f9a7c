/* A FUSE filesystem whose every file is a regular 4 KiB file that never answers a
 * read: the kernel has handed the read to this server, so the reader waits
 * uninterruptibly (Linux fs/fuse/dev.c request_wait_answer), as on the attribute of a
 * hung driver. Lookups, getattr and open answer at once. Used by the integration
 * tests (issue 31 row 3) under --host-root. Built with libfuse3 (Debian fuse3 and
 * libfuse3-dev, installed by scripts/setup.sh test).
 *
 * usage: hung_fuse MOUNTPOINT   (foreground, multithreaded). Killed, its connection
 * is aborted and every read it holds fails; the mount then needs fusermount3 -u -z.
 */
#define FUSE_USE_VERSION 31
#include <errno.h>
#include <fuse.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int hung_getattr(const char *path, struct stat *st, struct fuse_file_info *fi) {
    (void)fi;
    memset(st, 0, sizeof(*st));
    if (strcmp(path, "/") == 0) {
        st->st_mode = S_IFDIR | 0755;
        st->st_nlink = 2;
    } else {
        st->st_mode = S_IFREG | 0444;
        st->st_nlink = 1;
        st->st_size = 4096;
    }
    return 0;
}

static int hung_open(const char *path, struct fuse_file_info *fi) {
    (void)path;
    /* direct_io: every read reaches this server, none is served from the page cache. */
    fi->direct_io = 1;
    return 0;
}

static int hung_read(const char *path, char *buf, size_t size, off_t off,
                     struct fuse_file_info *fi) {
    (void)path; (void)buf; (void)size; (void)off; (void)fi;
    for (;;) pause(); /* never answers */
    return -EIO;
}

static const struct fuse_operations ops = {
    .getattr = hung_getattr,
    .open = hung_open,
    .read = hung_read,
};

int main(int argc, char *argv[]) {
    if (argc != 2) return 2;
    char *args[] = {argv[0], "-f", argv[1], NULL};
    return fuse_main(3, args, &ops, NULL);
}
