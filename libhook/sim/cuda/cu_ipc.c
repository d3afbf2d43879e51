/*
 * cu_ipc.c - IPC memory handles across processes.
 *
 * Exporting turns the allocation into a memfd mapping in place (same
 * address, same contents) and keeps the fd open; the 64-byte handle names
 * the owner (pid and start time), the fd and the range. The opener maps
 * the same memfd through /proc/<owner>/fd/<fd>, so both see one memory.
 * The bytes stay charged to the owner only, as on a GPU.
 */
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cu_sim.h"

#define IPC_MAGIC 0x43504955u /* "UIPC" */
#define CUDA_ERROR_ALREADY_MAPPED 208

struct ipc_handle {
    uint32_t magic;
    uint32_t dev;
    int32_t pid;
    int32_t fd;
    uint64_t owner_key;
    uint64_t size;   /* of the exported allocation */
    uint64_t offset; /* of the pointer within it */
    uint64_t map_len;
};
_Static_assert(sizeof(struct ipc_handle) <= sizeof(CUipcMemHandle), "IPC handle fits");

/* Move an anonymous allocation onto a memfd without changing its address. */
static CUresult make_shareable(struct cu_alloc *a)
{
    int fd = memfd_create("vgpu-sim-ipc", MFD_CLOEXEC);
    if (fd < 0)
        return CUDA_ERROR_OPERATING_SYSTEM;
    size_t done = 0;
    ssize_t n = 0;
    if (ftruncate(fd, (off_t)a->map_len) != 0)
        goto fail;
    while (done < a->map_len && (n = pwrite(fd, (char *)a->base + done, a->map_len - done, (off_t)done)) > 0)
        done += (size_t)n;
    if (done < a->map_len)
        goto fail;
    if (mmap((void *)a->base, a->map_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED)
        goto fail;
    a->fd = fd;
    return CUDA_SUCCESS;
fail:
    close(fd);
    return CUDA_ERROR_OPERATING_SYSTEM;
}

CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
    CUresult r = cu_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (pHandle == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&cu_lock);
    struct cu_alloc *a = cu_table_find(dptr);
    if (a == NULL || a->kind != CU_ALLOC_DEVICE || a->in_pool)
        r = CUDA_ERROR_INVALID_VALUE;
    else if (a->fd < 0)
        r = make_shareable(a);
    if (r == CUDA_SUCCESS) {
        struct ipc_handle h = {.magic = IPC_MAGIC,
                               .dev = a->dev,
                               .pid = cu_proc->pid,
                               .fd = a->fd,
                               .owner_key = sim_proc_key_of(cu_proc->pid),
                               .size = a->size,
                               .offset = dptr - a->base,
                               .map_len = a->map_len};
        memset(pHandle, 0, sizeof(*pHandle));
        memcpy(pHandle->reserved, &h, sizeof(h));
    }
    pthread_mutex_unlock(&cu_lock);
    return r;
}

static CUresult ipc_open(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int flags)
{
    CUcontext ctx;
    CUresult r = cu_current(&ctx);
    if (r != CUDA_SUCCESS)
        return r;
    struct ipc_handle h;
    memcpy(&h, handle.reserved, sizeof(h));
    if (pdptr == NULL || h.magic != IPC_MAGIC || (flags & ~(unsigned)CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (h.pid == cu_proc->pid)
        return CUDA_ERROR_INVALID_CONTEXT; /* a process cannot open its own handle */
    if (sim_proc_key_of(h.pid) != h.owner_key)
        return CUDA_ERROR_INVALID_VALUE; /* the owner is gone, and its memory with it */
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/fd/%d", h.pid, h.fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return CUDA_ERROR_INVALID_VALUE;
    void *p = mmap(NULL, h.map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct cu_alloc entry = {.base = (uintptr_t)p, .size = h.size, .map_len = h.map_len, .kind = CU_ALLOC_IPC,
                             .ctx = ctx, .dev = h.dev, .fd = -1};
    pthread_mutex_lock(&cu_lock);
    struct cu_alloc *a = cu_table_insert(&entry);
    pthread_mutex_unlock(&cu_lock);
    if (a == NULL) {
        munmap(p, h.map_len);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *pdptr = (uintptr_t)p + h.offset;
    return CUDA_SUCCESS;
}

CUresult cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
    return ipc_open(pdptr, handle, Flags);
}

CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
    return ipc_open(pdptr, handle, Flags);
}

CUresult cuIpcCloseMemHandle(CUdeviceptr dptr)
{
    CUresult r = cu_ready();
    if (r != CUDA_SUCCESS)
        return r;
    pthread_mutex_lock(&cu_lock);
    struct cu_alloc *a = cu_table_find(dptr);
    if (a != NULL && a->kind == CU_ALLOC_IPC)
        cu_alloc_release(a);
    else
        r = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_unlock(&cu_lock);
    return r;
}
