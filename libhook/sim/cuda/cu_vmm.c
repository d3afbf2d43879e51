/*
 * cu_vmm.c - virtual memory management. A physical allocation
 * (cuMemCreate) is a memfd charged to its device; a reservation is a
 * PROT_NONE anonymous mapping; cuMemMap maps the memfd over part of a
 * reservation and cuMemSetAccess opens it. As on the real driver, the
 * physical memory lives until the handle is released AND its last mapping
 * is unmapped (each mapping holds a reference), and a handle exported as a POSIX file descriptor
 * can be imported by another process without being charged twice.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cu_sim.h"

#define GRANULARITY (2u << 20)
#define CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR 1
#define CU_MEM_ACCESS_FLAGS_PROT_READ 1
#define CU_MEM_ACCESS_FLAGS_PROT_READWRITE 3

struct vmm_handle {
    uint32_t tag;
    int fd;
    size_t size;
    unsigned dev;
    uint64_t charged;
    int refs;    /* handle references plus mappings (cu_lock) */
    int handles; /* handle references: cuMemCreate's, plus one per retain */
};
#define VMM_TAG 0x564d4d31u
#define VMM_MEMFD "vgpu-sim-vmm-" /* memfd name prefix; the device index follows */

struct reservation {
    uintptr_t base;
    size_t size;
    struct reservation *next;
};

static struct reservation *g_reservations; /* guarded by cu_lock */

static struct vmm_handle *handle_of(CUmemGenericAllocationHandle h)
{
    struct vmm_handle *v = (struct vmm_handle *)(uintptr_t)h;
    return v != NULL && v->tag == VMM_TAG ? v : NULL;
}

static bool granular(size_t n)
{
    return n % GRANULARITY == 0;
}

CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                       CUmemAllocationGranularity_flags option)
{
    CUresult r = cu_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (granularity == NULL || prop == NULL || option < 0 || option > 1)
        return CUDA_ERROR_INVALID_VALUE;
    *granularity = GRANULARITY; /* minimum and recommended alike */
    return CUDA_SUCCESS;
}

static CUresult new_handle(int fd, size_t size, unsigned dev, uint64_t charged, CUmemGenericAllocationHandle *out)
{
    struct vmm_handle *v = malloc(sizeof(*v));
    if (v == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *v = (struct vmm_handle){.tag = VMM_TAG, .fd = fd, .size = size, .dev = dev, .charged = charged, .refs = 1, .handles = 1};
    *out = (CUmemGenericAllocationHandle)(uintptr_t)v;
    return CUDA_SUCCESS;
}

/* Drop one reference; the last gives the memory back (cu_lock held). */
static void vmm_unref(struct vmm_handle *v)
{
    if (--v->refs > 0)
        return;
    cu_uncharge(v->dev, v->charged);
    close(v->fd);
    free(v);
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                     unsigned long long flags)
{
    CUresult r = cu_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (handle == NULL || prop == NULL || flags != 0 || size == 0 || !granular(size) ||
        prop->type != CU_MEM_ALLOCATION_TYPE_PINNED || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    struct cu_device *d;
    if (cu_device_of(prop->location.id, &d) != CUDA_SUCCESS)
        return CUDA_ERROR_INVALID_DEVICE;
    if ((r = cu_charge(d->dev, size)) != CUDA_SUCCESS)
        return r;
    char name[32]; /* the device travels with an exported descriptor */
    snprintf(name, sizeof(name), VMM_MEMFD "%u", d->dev);
    int fd = memfd_create(name, MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0 || (r = new_handle(fd, size, d->dev, size, handle)) != CUDA_SUCCESS) {
        if (fd >= 0)
            close(fd);
        cu_uncharge(d->dev, size);
        return r != CUDA_SUCCESS ? r : CUDA_ERROR_OUT_OF_MEMORY;
    }
    return CUDA_SUCCESS;
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    CUresult r = cu_ready();
    if (r != CUDA_SUCCESS)
        return r;
    pthread_mutex_lock(&cu_lock);
    struct vmm_handle *v = handle_of(handle);
    if (v == NULL) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else {
        if (--v->handles == 0)
            v->tag = CU_TAG_DEAD; /* the handle is gone; its mappings keep the memory */
        vmm_unref(v);
    }
    pthread_mutex_unlock(&cu_lock);
    return r;
}

CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags)
{
    CUresult r = cu_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (alignment == 0)
        alignment = GRANULARITY;
    if (ptr == NULL || size == 0 || !granular(size) || flags != 0 || (alignment & (alignment - 1)) != 0 ||
        size > SIZE_MAX - alignment)
        return CUDA_ERROR_INVALID_VALUE;
    /* Over-reserve, then trim to the asked alignment. addr is a hint. */
    size_t span = size + alignment;
    char *raw = mmap((void *)(uintptr_t)addr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    uintptr_t base = ((uintptr_t)raw + alignment - 1) & ~(uintptr_t)(alignment - 1);
    if (base > (uintptr_t)raw)
        munmap(raw, base - (uintptr_t)raw);
    if ((uintptr_t)raw + span > base + size)
        munmap((void *)(base + size), (uintptr_t)raw + span - (base + size));
    struct reservation *res = malloc(sizeof(*res));
    if (res == NULL) {
        munmap((void *)base, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_lock(&cu_lock);
    *res = (struct reservation){.base = base, .size = size, .next = g_reservations};
    g_reservations = res;
    pthread_mutex_unlock(&cu_lock);
    *ptr = base;
    return CUDA_SUCCESS;
}

static struct reservation *reservation_holding(uintptr_t p, size_t size)
{
    for (struct reservation *res = g_reservations; res != NULL; res = res->next)
        if (p >= res->base && size <= res->size && p - res->base <= res->size - size)
            return res;
    return NULL;
}

/* Put [p, p + size) back to reserved-only, dropping its mapped ranges. */
static void unmap_range(uintptr_t p, size_t size)
{
    for (struct cu_alloc *a; (a = cu_table_next_in(p, size, CU_ALLOC_VMM)) != NULL;) {
        struct vmm_handle *v = a->vmm;
        cu_alloc_release(a);
        vmm_unref(v);
    }
    mmap((void *)p, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    CUresult r = cu_ready();
    if (r != CUDA_SUCCESS)
        return r;
    pthread_mutex_lock(&cu_lock);
    struct reservation **link = &g_reservations;
    while (*link != NULL && ((*link)->base != ptr || (*link)->size != size))
        link = &(*link)->next;
    struct reservation *res = *link;
    if (res == NULL) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else {
        unmap_range(res->base, res->size);
        munmap((void *)res->base, res->size);
        *link = res->next;
        free(res);
    }
    pthread_mutex_unlock(&cu_lock);
    return r;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags)
{
    CUresult r = cu_ready();
    if (r != CUDA_SUCCESS)
        return r;
    struct vmm_handle *v = handle_of(handle);
    if (v == NULL || flags != 0 || size == 0 || !granular(size) || !granular(offset) || !granular(ptr) ||
        offset > v->size || size > v->size - offset)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&cu_lock);
    if (reservation_holding(ptr, size) == NULL || cu_table_overlaps(ptr, size)) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else if (mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, v->fd, (off_t)offset) ==
               MAP_FAILED) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        struct cu_alloc entry = {.base = ptr, .size = size, .kind = CU_ALLOC_VMM, .dev = v->dev, .fd = -1, .vmm = v};
        if (cu_table_insert(&entry) == NULL) {
            mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            v->refs++;
        }
    }
    pthread_mutex_unlock(&cu_lock);
    return r;
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    CUresult r = cu_ready();
    if (r != CUDA_SUCCESS)
        return r;
    pthread_mutex_lock(&cu_lock);
    if (size == 0 || reservation_holding(ptr, size) == NULL || cu_table_base(ptr) == NULL)
        r = CUDA_ERROR_INVALID_VALUE;
    else
        unmap_range(ptr, size);
    pthread_mutex_unlock(&cu_lock);
    return r;
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
    CUresult r = cu_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (desc == NULL || count == 0 || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    int prot = PROT_NONE;
    for (size_t i = 0; i < count; i++) {
        struct cu_device *d;
        if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || cu_device_of(desc[i].location.id, &d) != CUDA_SUCCESS)
            return CUDA_ERROR_INVALID_DEVICE;
        if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
            prot = PROT_READ | PROT_WRITE;
        else if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READ && prot == PROT_NONE)
            prot = PROT_READ;
        else if (desc[i].flags != 0 && desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READ)
            return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_lock(&cu_lock);
    /* Every byte must be mapped: walk the mapped ranges from ptr on. */
    uintptr_t p = ptr, end = ptr + size;
    struct cu_alloc *a;
    while (p < end && (a = cu_table_find(p)) != NULL && a->kind == CU_ALLOC_VMM)
        p = a->base + a->size;
    if (p < end || mprotect((void *)(uintptr_t)ptr, size, prot) != 0)
        r = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_unlock(&cu_lock);
    return r;
}

CUresult cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle, int handleType,
                                      unsigned long long flags)
{
    CUresult r = cu_ready();
    if (r != CUDA_SUCCESS)
        return r;
    struct vmm_handle *v = handle_of(handle);
    if (v == NULL || shareableHandle == NULL || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_NOT_SUPPORTED;
    int fd = fcntl(v->fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0)
        return CUDA_ERROR_OPERATING_SYSTEM;
    *(int *)shareableHandle = fd;
    return CUDA_SUCCESS;
}

/* The device a VMM memfd was created on (its name says), else the first
 * visible device's. */
static unsigned memfd_device(int fd)
{
    char link[64], target[128];
    unsigned dev;
    snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof(target) - 1);
    if (n > 0) {
        target[n] = '\0';
        if (sscanf(target, "/memfd:" VMM_MEMFD "%u", &dev) == 1 && dev < cu_proc->st->config.devices)
            return dev;
    }
    return cu_proc->devices[0].dev;
}

CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle, int shHandleType)
{
    CUresult r = cu_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (handle == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_NOT_SUPPORTED;
    struct stat sb;
    int fd = fcntl((int)(intptr_t)osHandle, F_DUPFD_CLOEXEC, 0);
    if (fd < 0 || fstat(fd, &sb) != 0 || sb.st_size <= 0 || !granular((size_t)sb.st_size)) {
        if (fd >= 0)
            close(fd);
        return CUDA_ERROR_INVALID_VALUE;
    }
    /* The exporter is charged; the importer's view costs nothing more. */
    r = new_handle(fd, (size_t)sb.st_size, memfd_device(fd), 0, handle);
    if (r != CUDA_SUCCESS)
        close(fd);
    return r;
}

/* The handle of the memory mapped at addr, one more reference to it (to be
 * released with cuMemRelease): it keeps the memory alive like the first. */
CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    CUresult r = cu_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (handle == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&cu_lock);
    struct cu_alloc *a = cu_table_find((uintptr_t)addr);
    if (a == NULL || a->kind != CU_ALLOC_VMM) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else {
        struct vmm_handle *v = a->vmm;
        v->tag = VMM_TAG;
        v->handles++;
        v->refs++;
        *handle = (CUmemGenericAllocationHandle)(uintptr_t)v;
    }
    pthread_mutex_unlock(&cu_lock);
    return r;
}

/* Sparse arrays are not simulated. */
CUresult cuMemMapArrayAsync(CUarrayMapInfo *mapInfoList, unsigned int count, CUstream hStream)
{
    (void)mapInfoList;
    (void)count;
    (void)hStream;
    CUresult r = cu_ready();
    return r != CUDA_SUCCESS ? r : CUDA_ERROR_NOT_SUPPORTED;
}

CUresult cuMemMapArrayAsync_ptsz(CUarrayMapInfo *mapInfoList, unsigned int count, CUstream hStream)
{
    (void)mapInfoList;
    (void)count;
    (void)hStream;
    CUresult r = cu_ready();
    return r != CUDA_SUCCESS ? r : CUDA_ERROR_NOT_SUPPORTED;
}
