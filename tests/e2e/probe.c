/*
 * probe.c - what a process inside a test container tries against vGPU
 * files. Built statically by tests/e2e/build_rootfs.sh into the test root
 * filesystem as /usr/bin/vgpu-probe.
 *
 *   vgpu-probe open PATH r|w      open for reading or writing
 *   vgpu-probe map PATH           map for writing: MAP_SHARED PROT_WRITE on
 *                                 a read-only fd, and mprotect of a
 *                                 read-only mapping to PROT_WRITE
 *   vgpu-probe poke PATH OFFSET HEX64   write 8 bytes at OFFSET
 *   vgpu-probe truncate PATH SIZE       set the file's size
 *
 * Prints one line per attempt, "OK <what>" or "DENIED <what>: <errno name>",
 * and exits 0 if every attempt succeeded, 1 if any was refused, 2 on bad
 * usage.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static int report(int ok, const char *what)
{
    if (ok)
        printf("OK %s\n", what);
    else
        printf("DENIED %s: %s\n", what, strerrorname_np(errno) ? strerrorname_np(errno) : "?");
    return ok ? 0 : 1;
}

static int do_open(const char *path, const char *mode)
{
    int flags = strcmp(mode, "w") == 0 ? O_WRONLY : O_RDONLY;
    int fd = open(path, flags | O_CLOEXEC);
    int rc = report(fd >= 0, flags == O_WRONLY ? "open-write" : "open-read");
    if (fd >= 0)
        close(fd);
    return rc;
}

static int do_map(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (report(fd >= 0, "open-read"))
        return 1;
    long page = sysconf(_SC_PAGESIZE);
    void *rw = mmap(NULL, (size_t)page, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int rc = report(rw != MAP_FAILED, "mmap-write");
    if (rw != MAP_FAILED)
        munmap(rw, (size_t)page);
    void *ro = mmap(NULL, (size_t)page, PROT_READ, MAP_SHARED, fd, 0);
    if (ro != MAP_FAILED) {
        rc |= report(mprotect(ro, (size_t)page, PROT_READ | PROT_WRITE) == 0, "mprotect-write");
        munmap(ro, (size_t)page);
    }
    close(fd);
    return rc;
}

static int do_poke(const char *path, const char *offset_text, const char *value_text)
{
    char *end;
    errno = 0;
    long long offset = strtoll(offset_text, &end, 0);
    if (errno || *end || offset < 0)
        return fprintf(stderr, "vgpu-probe: bad offset %s\n", offset_text), 2;
    uint64_t value = strtoull(value_text, &end, 16);
    if (errno || *end)
        return fprintf(stderr, "vgpu-probe: bad value %s\n", value_text), 2;
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (report(fd >= 0, "open-write"))
        return 1;
    int rc = report(pwrite(fd, &value, sizeof(value), (off_t)offset) == (ssize_t)sizeof(value),
                    "write");
    close(fd);
    return rc;
}

static int do_truncate(const char *path, const char *size_text)
{
    char *end;
    errno = 0;
    long long size = strtoll(size_text, &end, 0);
    if (errno || *end || size < 0)
        return fprintf(stderr, "vgpu-probe: bad size %s\n", size_text), 2;
    return report(truncate(path, (off_t)size) == 0, "truncate");
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc == 4 && strcmp(argv[1], "open") == 0)
        return do_open(argv[2], argv[3]);
    if (argc == 3 && strcmp(argv[1], "map") == 0)
        return do_map(argv[2]);
    if (argc == 5 && strcmp(argv[1], "poke") == 0)
        return do_poke(argv[2], argv[3], argv[4]);
    if (argc == 4 && strcmp(argv[1], "truncate") == 0)
        return do_truncate(argv[2], argv[3]);
    fprintf(stderr, "usage: vgpu-probe open PATH r|w | map PATH | poke PATH OFFSET HEX64 | "
                    "truncate PATH SIZE\n");
    return 2;
}
