/*
 * vgpu-memprobe - drive one device allocation path at a time and report
 * what the process sees, as JSON lines. A test tool for the memory hook;
 * the same binary runs on the simulator and on a real GPU (driver API only,
 * no CUDA toolkit).
 *
 * Run `vgpu-memprobe --help` for the options and commands.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cuda_api.h"
#include "nvml_api.h"

/* field, exported versioned name, base name for cuGetProcAddress */
#define PROBE_CUDA(X) \
    X(cuInit, cuInit, cuInit) \
    X(cuGetErrorName, cuGetErrorName, cuGetErrorName) \
    X(cuDeviceGet, cuDeviceGet, cuDeviceGet) \
    X(cuDeviceGetUuid, cuDeviceGetUuid, cuDeviceGetUuid) \
    X(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain) \
    X(cuCtxSetCurrent, cuCtxSetCurrent, cuCtxSetCurrent) \
    X(cuCtxSynchronize, cuCtxSynchronize, cuCtxSynchronize) \
    X(cuCtxCreate, cuCtxCreate_v3, cuCtxCreate) \
    X(cuCtxDestroy, cuCtxDestroy_v2, cuCtxDestroy) \
    X(cuCtxPushCurrent, cuCtxPushCurrent_v2, cuCtxPushCurrent) \
    X(cuCtxPopCurrent, cuCtxPopCurrent_v2, cuCtxPopCurrent) \
    X(cuCtxSetLimit, cuCtxSetLimit, cuCtxSetLimit) \
    X(cuStreamCreate, cuStreamCreate, cuStreamCreate) \
    X(cuStreamBeginCapture, cuStreamBeginCapture_v2, cuStreamBeginCapture) \
    X(cuStreamEndCapture, cuStreamEndCapture, cuStreamEndCapture) \
    X(cuMemPoolDestroy, cuMemPoolDestroy, cuMemPoolDestroy) \
    X(cuMemAddressReserve, cuMemAddressReserve, cuMemAddressReserve) \
    X(cuMemAddressFree, cuMemAddressFree, cuMemAddressFree) \
    X(cuMemMap, cuMemMap, cuMemMap) \
    X(cuMemUnmap, cuMemUnmap, cuMemUnmap) \
    X(cuMemSetAccess, cuMemSetAccess, cuMemSetAccess) \
    X(cuMemRetainAllocationHandle, cuMemRetainAllocationHandle, cuMemRetainAllocationHandle) \
    X(cuGraphAddNode, cuGraphAddNode, cuGraphAddNode) \
    X(cuGraphAddNode_v2, cuGraphAddNode_v2, cuGraphAddNode) \
    X(cuMemGetInfo, cuMemGetInfo_v2, cuMemGetInfo) \
    X(cuDeviceTotalMem, cuDeviceTotalMem_v2, cuDeviceTotalMem) \
    X(cuMemAlloc, cuMemAlloc_v2, cuMemAlloc) \
    X(cuMemAllocV1, cuMemAlloc, cuMemAlloc) \
    X(cuMemFree, cuMemFree_v2, cuMemFree) \
    X(cuMemAllocPitch, cuMemAllocPitch_v2, cuMemAllocPitch) \
    X(cuMemAllocManaged, cuMemAllocManaged, cuMemAllocManaged) \
    X(cuMemAllocAsync, cuMemAllocAsync, cuMemAllocAsync) \
    X(cuMemFreeAsync, cuMemFreeAsync, cuMemFreeAsync) \
    X(cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync) \
    X(cuDeviceGetDefaultMemPool, cuDeviceGetDefaultMemPool, cuDeviceGetDefaultMemPool) \
    X(cuMemPoolCreate, cuMemPoolCreate, cuMemPoolCreate) \
    X(cuMemPoolTrimTo, cuMemPoolTrimTo, cuMemPoolTrimTo) \
    X(cuMemCreate, cuMemCreate, cuMemCreate) \
    X(cuMemRelease, cuMemRelease, cuMemRelease) \
    X(cuMemGetAllocationGranularity, cuMemGetAllocationGranularity, \
      cuMemGetAllocationGranularity) \
    X(cuArrayCreate, cuArrayCreate_v2, cuArrayCreate) \
    X(cuArray3DCreate, cuArray3DCreate_v2, cuArray3DCreate) \
    X(cuArrayDestroy, cuArrayDestroy, cuArrayDestroy) \
    X(cuMipmappedArrayCreate, cuMipmappedArrayCreate, cuMipmappedArrayCreate) \
    X(cuMipmappedArrayDestroy, cuMipmappedArrayDestroy, cuMipmappedArrayDestroy) \
    X(cuGraphCreate, cuGraphCreate, cuGraphCreate) \
    X(cuGraphAddMemAllocNode, cuGraphAddMemAllocNode, cuGraphAddMemAllocNode) \
    X(cuGraphAddMemFreeNode, cuGraphAddMemFreeNode, cuGraphAddMemFreeNode) \
    X(cuGraphDestroy, cuGraphDestroy, cuGraphDestroy) \
    X(cuGraphInstantiateWithFlags, cuGraphInstantiateWithFlags, cuGraphInstantiateWithFlags) \
    X(cuGraphLaunch, cuGraphLaunch, cuGraphLaunch) \
    X(cuGraphExecDestroy, cuGraphExecDestroy, cuGraphExecDestroy) \
    X(cuDeviceGraphMemTrim, cuDeviceGraphMemTrim, cuDeviceGraphMemTrim) \
    X(cuMemHostAlloc, cuMemHostAlloc, cuMemHostAlloc) \
    X(cuMemFreeHost, cuMemFreeHost, cuMemFreeHost) \
    X(cuMemsetD32, cuMemsetD32_v2, cuMemsetD32) \
    X(cuMemcpyDtoH, cuMemcpyDtoH_v2, cuMemcpyDtoH) \
    X(cuIpcGetMemHandle, cuIpcGetMemHandle, cuIpcGetMemHandle) \
    X(cuIpcOpenMemHandle, cuIpcOpenMemHandle_v2, cuIpcOpenMemHandle) \
    X(cuIpcCloseMemHandle, cuIpcCloseMemHandle, cuIpcCloseMemHandle) \
    X(cuMemExportToShareableHandle, cuMemExportToShareableHandle, cuMemExportToShareableHandle) \
    X(cuMemImportFromShareableHandle, cuMemImportFromShareableHandle, \
      cuMemImportFromShareableHandle) \
    X(cuCtxEnablePeerAccess, cuCtxEnablePeerAccess, cuCtxEnablePeerAccess) \
    X(cuMemcpyPeer, cuMemcpyPeer, cuMemcpyPeer) \
    X(cuMulticastCreate, cuMulticastCreate, cuMulticastCreate)

#define FIELD(field, name, base) __typeof__(name) *field;
static struct {
    PROBE_CUDA(FIELD)
} cu;
#undef FIELD

/* How cuCtxCreate is resolved for ctx:NAME: the probe's own choice. */
static struct {
    void *lib;
    const char *how;
    int version;
    cuuint64_t flags;
} road;

static struct {
    __typeof__(nvmlInit_v2) *init;
    __typeof__(nvmlDeviceGetHandleByUUID) *by_uuid;
    __typeof__(nvmlDeviceGetMemoryInfo) *memory;
    __typeof__(nvmlDeviceGetComputeRunningProcesses_v3) *processes;
} nv;

enum path {
    P_ALLOC, P_ALLOC_V1, P_PITCH, P_MANAGED, P_ASYNC, P_POOL, P_VMM, P_ARRAY, P_ARRAY3D,
    P_MIPMAP, P_GRAPH, P_HOST, P_VMMMAP, P_GRAPHNODE, P_GRAPHNODE2, P_MIPMAPLAYERED, P_COUNT
};
static const char *const path_names[P_COUNT] = {
    "alloc", "alloc_v1", "pitch", "managed", "async", "pool", "vmm", "array", "array3d",
    "mipmap", "graph", "host", "vmmmap", "graphnode", "graphnode2", "mipmaplayered",
};

struct allocation {
    enum path path;
    uint64_t size;
    CUdeviceptr ptr;   /* linear paths */
    void *handle;      /* arrays, host memory, graphs */
    CUgraphExec exec;  /* graph path: the launched graph */
    CUmemGenericAllocationHandle vmm;
};

#define MAX_ALLOCS 4096
#define POSIX_FD_HANDLE 1 /* CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR */
static struct allocation allocs[MAX_ALLOCS];
static int nallocs;
static CUdevice device;
static CUmemoryPool own_pool;

static const char *err_name(CUresult rc)
{
    const char *name = NULL;
    if (cu.cuGetErrorName == NULL || cu.cuGetErrorName(rc, &name) != CUDA_SUCCESS || !name)
        return "CUDA_ERROR_UNKNOWN";
    return name;
}

static const char USAGE[] =
    "usage: vgpu-memprobe [--device N] [--resolve dlsym|procaddr] [--cuda-version V]\n"
    "                     [--ptsz] COMMAND...\n"
    "\n"
    "Commands run in order; each prints one JSON object on stdout:\n"
    "  alloc:PATH:SIZE   allocate through PATH (alloc, alloc_v1, pitch, managed,\n"
    "                    async, pool, vmm, array, array3d, mipmap, graph, host;\n"
    "                    vmmmap: cuMemCreate + map + cuMemRelease, the mapping\n"
    "                    kept, freed by unmapping; graphnode, graphnode2: the\n"
    "                    graph path through cuGraphAddNode / cuGraphAddNode_v2;\n"
    "                    mipmaplayered: a layered 2D mipmapped array of 32\n"
    "                    layers asking for 100 levels)\n"
    "  free              free the most recent allocation through its own free\n"
    "  freeall           free every allocation, newest first\n"
    "  fill:VALUE        write VALUE (u32) over every linear allocation, read\n"
    "                    it back and report whether it matched\n"
    "  ctx:NAME          create a context (made current) through the exported\n"
    "                    variant NAME (cuCtxCreate, cuCtxCreate_v2, _v3, _v4); with\n"
    "                    --resolve procaddr the pointer comes from\n"
    "                    cuGetProcAddress_v2(\"cuCtxCreate\", --cuda-version) and\n"
    "                    must be NAME's (\"result\":\"wrong-variant\" otherwise)\n"
    "  device:N          make device ordinal N's primary context current: the\n"
    "                    commands after it work on device N (as --device N)\n"
    "  meminfo           cuMemGetInfo_v2 and cuDeviceTotalMem_v2\n"
    "  nvml              NVML memory info and compute process pids of the device\n"
    "  trim              trim the pools (default pool, graph memory) after a sync\n"
    "  sync              cuCtxSynchronize\n"
    "  limit:NAME:VALUE  cuCtxSetLimit of stack, fifo or heap to VALUE bytes\n"
    "  ctx-leak:SIZE     create a context, allocate SIZE in it, destroy the\n"
    "                    context without freeing, make the primary current again\n"
    "  pool-destroy      destroy the pool of the pool path (allocations may live)\n"
    "  async-on:N:SIZE   cuMemAllocAsync on a stream of device N's primary\n"
    "                    context, the current context staying device --device's\n"
    "  pool-on:N:SIZE    cuMemAllocFromPoolAsync from a new pool of device N on\n"
    "                    the current (--device) context's stream\n"
    "  kind:A:L:SIZE     a pool, a cuMemCreate handle and a graph memory node of\n"
    "                    allocation type A and location type L (the numbers of\n"
    "                    cuda.h's enums) on the device, each reported\n"
    "  capture:SIZE      capture cuMemAllocAsync + cuMemFreeAsync of SIZE on a\n"
    "                    new stream into a graph, run it once, destroy it\n"
    "  pools:N:SIZE      create N pools on the device; allocate 4 KiB from each\n"
    "                    but the last, SIZE from the last, and free each back\n"
    "                    to its pool (the pools keep them)\n"
    "  vmm-retain:SIZE   cuMemCreate + map + cuMemRelease, then the handle taken\n"
    "                    back with cuMemRetainAllocationHandle and everything\n"
    "                    unmapped: the retained handle alone keeps the memory\n"
    "  graph-drop:SIZE   a graph with an allocation node (and its free node),\n"
    "                    destroyed without being instantiated\n"
    "  graph-keep:SIZE   the graph path's graph run, then destroyed (and its\n"
    "                    executable graph), its allocation kept: it outlives\n"
    "                    the graph until freed (free frees it)\n"
    "  ipc-export        export the most recent allocation; prints its handle\n"
    "  ipc-open:HEX      open an exported handle and read its first u32\n"
    "  vmm-export        export the most recent allocation (a vmm handle) as a\n"
    "                    POSIX file descriptor; prints this pid and the fd\n"
    "  vmm-import:PID:FD import the descriptor FD of process PID (through\n"
    "                    /proc/PID/fd/FD), map all of it, release the imported\n"
    "                    handle (the mapping keeps it), read its first u32; the\n"
    "                    mapping is the most recent allocation (free unmaps it)\n"
    "  peer-copy:N       enable peer access both ways between the current\n"
    "                    device and device N, allocate on device N as much as\n"
    "                    the most recent allocation, cuMemcpyPeer it there and\n"
    "                    read the copy's first u32 (kept; free frees it)\n"
    "  multicast:SIZE    cuMulticastCreate of SIZE bytes over one device\n"
    "  churn:PATH:SIZE   allocate and free through PATH forever (for kill tests)\n"
    "  bench:PATH:SIZE:N time N alloc+free pairs (after a warm-up); prints the\n"
    "                    median, p99 and mean ns per pair\n"
    "  fork              fork: the child runs the remaining commands and exits\n"
    "                    normally; the parent waits for it, prints\n"
    "                    {\"op\":\"forked\",\"status\":S}, then runs them too\n"
    "  reinit            cuInit and the primary context again, made current (a\n"
    "                    forked child on the simulator; a real driver refuses)\n"
    "  wait              print {\"op\":\"wait\"} and block until a line on stdin\n"
    "  exit              exit at once, leaving everything allocated\n"
    "or, alone and before anything is initialised:\n"
    "  roads             how every road resolves a set of entry points: for each\n"
    "                    cuGetProcAddress(_v2) request (symbol, version, flags)\n"
    "                    and dlsym lookup, the library and exported name of the\n"
    "                    pointer obtained\n"
    "Exit status: 0, 2 for bad arguments, 1 if the driver could not start.\n";

static void usage_exit(const char *why)
{
    fprintf(stderr, "vgpu-memprobe: %s (see --help)\n", why);
    exit(2);
}

static int parse_size(const char *text, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno || end == text)
        return -1;
    unsigned shift = 0;
    switch (*end) {
    case 'k': case 'K': shift = 10; end++; break;
    case 'm': case 'M': shift = 20; end++; break;
    case 'g': case 'G': shift = 30; end++; break;
    default: break;
    }
    if (*end != '\0')
        return -1;
    *out = (uint64_t)v << shift;
    return 0;
}

static int resolve_cuda(const char *how, int version, int ptsz)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (lib == NULL) {
        fprintf(stderr, "vgpu-memprobe: %s\n", dlerror());
        return -1;
    }
    cuuint64_t flags = ptsz ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
                            : CU_GET_PROC_ADDRESS_DEFAULT;
    road.lib = lib;
    road.how = how;
    road.version = version;
    road.flags = flags;
    if (strcmp(how, "dlsym") == 0) {
#define BY_NAME(field, name, base) cu.field = (__typeof__(name) *)dlsym(lib, #name);
        PROBE_CUDA(BY_NAME)
#undef BY_NAME
        return 0;
    }
    __typeof__(cuGetProcAddress_v2) *gpa =
        (__typeof__(cuGetProcAddress_v2) *)dlsym(lib, "cuGetProcAddress_v2");
    if (gpa == NULL)
        return -1;
    CUdriverProcAddressQueryResult status;
#define BY_PROC(field, name, base) \
    if (gpa(#base, (void **)&cu.field, version, flags, &status) != CUDA_SUCCESS) \
        cu.field = NULL;
    PROBE_CUDA(BY_PROC)
#undef BY_PROC
    /* The v1 ABI is only handed out to callers of old versions. */
    cu.cuMemAllocV1 = (__typeof__(cuMemAlloc) *)dlsym(lib, "cuMemAlloc");
    /* The first generic cuGraphAddNode is what a CUDA 12.2 caller gets. */
    if (gpa("cuGraphAddNode", (void **)&cu.cuGraphAddNode, 12020, flags, &status) != CUDA_SUCCESS)
        cu.cuGraphAddNode = NULL;
    return 0;
}

static void resolve_nvml(void)
{
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (lib == NULL)
        return;
    nv.init = (__typeof__(nv.init))dlsym(lib, "nvmlInit_v2");
    nv.by_uuid = (__typeof__(nv.by_uuid))dlsym(lib, "nvmlDeviceGetHandleByUUID");
    nv.memory = (__typeof__(nv.memory))dlsym(lib, "nvmlDeviceGetMemoryInfo");
    nv.processes = (__typeof__(nv.processes))dlsym(lib, "nvmlDeviceGetComputeRunningProcesses_v3");
    if (nv.init == NULL || nv.by_uuid == NULL || nv.memory == NULL || nv.processes == NULL ||
        nv.init() != NVML_SUCCESS)
        nv.init = NULL;
}

static void report(const char *op, const char *path, uint64_t size, CUresult rc)
{
    printf("{\"op\":\"%s\",\"path\":\"%s\",\"size\":%" PRIu64 ",\"result\":\"%s\",\"code\":%d}\n",
           op, path, size, err_name(rc), rc);
    fflush(stdout);
}

/* Add an allocation node of `size` on the probe's device through the road
 * of `path` (cuGraphAddMemAllocNode, cuGraphAddNode, cuGraphAddNode_v2). */
static CUresult add_alloc_node(enum path path, CUgraph graph, uint64_t size, CUdeviceptr *ptr)
{
    CUgraphNodeParams generic;
    memset(&generic, 0, sizeof(generic));
    generic.type = CU_GRAPH_NODE_TYPE_MEM_ALLOC;
    CUDA_MEM_ALLOC_NODE_PARAMS *params = &generic.u.alloc;
    params->poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    params->poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    params->poolProps.location.id = device;
    params->bytesize = size;
    CUgraphNode node;
    CUresult rc = path == P_GRAPHNODE    ? cu.cuGraphAddNode(&node, graph, NULL, 0, &generic)
                  : path == P_GRAPHNODE2 ? cu.cuGraphAddNode_v2(&node, graph, NULL, NULL, 0, &generic)
                                         : cu.cuGraphAddMemAllocNode(&node, graph, NULL, 0, params);
    *ptr = params->dptr;
    return rc;
}

/* A graph with one memory allocation node, instantiated and launched so
 * that the allocation exists (and may be freed outside the graph). */
static CUresult alloc_graph(struct allocation *a)
{
    CUgraph graph = NULL;
    CUgraphExec exec = NULL;
    CUdeviceptr ptr = 0;
    CUresult rc = cu.cuGraphCreate(&graph, 0);
    if (rc == CUDA_SUCCESS)
        rc = add_alloc_node(a->path, graph, a->size, &ptr);
    if (rc == CUDA_SUCCESS)
        rc = cu.cuGraphInstantiateWithFlags(&exec, graph, 0);
    if (rc == CUDA_SUCCESS)
        rc = cu.cuGraphLaunch(exec, NULL);
    if (rc == CUDA_SUCCESS)
        rc = cu.cuCtxSynchronize();
    if (rc != CUDA_SUCCESS) {
        if (exec != NULL)
            cu.cuGraphExecDestroy(exec);
        if (graph != NULL)
            cu.cuGraphDestroy(graph);
        return rc;
    }
    a->ptr = ptr;
    a->handle = graph;
    a->exec = exec;
    return rc;
}

/* Physical memory mapped, then its handle released at once: the mapping
 * alone keeps the memory (PyTorch's expandable segments release early). */
static CUresult alloc_vmm_mapped(struct allocation *a)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    CUmemAccessDesc access = {{CU_MEM_LOCATION_TYPE_DEVICE, device}, 3 /* read-write */};
    CUresult rc = cu.cuMemCreate(&a->vmm, a->size, &prop, 0);
    if (rc != CUDA_SUCCESS)
        return rc;
    rc = cu.cuMemAddressReserve(&a->ptr, a->size, 0, 0, 0);
    if (rc == CUDA_SUCCESS && (rc = cu.cuMemMap(a->ptr, a->size, 0, a->vmm, 0)) == CUDA_SUCCESS)
        rc = cu.cuMemSetAccess(a->ptr, a->size, &access, 1);
    CUresult released = cu.cuMemRelease(a->vmm);
    if (rc == CUDA_SUCCESS)
        rc = released;
    if (rc != CUDA_SUCCESS && a->ptr != 0) {
        cu.cuMemUnmap(a->ptr, a->size);
        cu.cuMemAddressFree(a->ptr, a->size);
    }
    return rc;
}

static CUresult do_alloc(struct allocation *a)
{
    /* Shapes every GPU accepts: rows of 4096 floats; cubes 256 x 256 floats
     * deep; a 2D mipmap of two levels (the second a quarter of the first). */
    CUDA_ARRAY_DESCRIPTOR d2 = {4096, a->size / 16384, CU_AD_FORMAT_FLOAT, 1};
    CUDA_ARRAY3D_DESCRIPTOR d3 = {256, 256, a->size / 262144, CU_AD_FORMAT_FLOAT, 1, 0};
    size_t pitch;
    switch (a->path) {
    case P_ALLOC:
        return cu.cuMemAlloc(&a->ptr, a->size);
    case P_ALLOC_V1:
        return cu.cuMemAllocV1(&a->ptr, (unsigned int)a->size);
    case P_PITCH:
        return cu.cuMemAllocPitch(&a->ptr, &pitch, a->size / 16, 16, 4);
    case P_MANAGED:
        return cu.cuMemAllocManaged(&a->ptr, a->size, CU_MEM_ATTACH_GLOBAL);
    case P_ASYNC:
        return cu.cuMemAllocAsync(&a->ptr, a->size, NULL);
    case P_POOL: {
        if (own_pool == NULL) {
            CUmemPoolProps props;
            memset(&props, 0, sizeof(props));
            props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
            props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            props.location.id = device;
            CUresult rc = cu.cuMemPoolCreate(&own_pool, &props);
            if (rc != CUDA_SUCCESS)
                return rc;
        }
        return cu.cuMemAllocFromPoolAsync(&a->ptr, a->size, own_pool, NULL);
    }
    case P_VMM: {
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof(prop));
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = device;
        prop.requestedHandleTypes = POSIX_FD_HANDLE; /* so that vmm-export can share it */
        return cu.cuMemCreate(&a->vmm, a->size, &prop, 0);
    }
    case P_ARRAY:
        return cu.cuArrayCreate((CUarray *)&a->handle, &d2);
    case P_ARRAY3D:
        return cu.cuArray3DCreate((CUarray *)&a->handle, &d3);
    case P_MIPMAP:
        d3.Width = 4096;
        d3.Height = a->size / 16384;
        d3.Depth = 0;
        return cu.cuMipmappedArrayCreate((CUmipmappedArray *)&a->handle, &d3, 2);
    case P_GRAPH:
    case P_GRAPHNODE:
    case P_GRAPHNODE2:
        return alloc_graph(a);
    case P_HOST:
        return cu.cuMemHostAlloc(&a->handle, a->size, CU_MEMHOSTALLOC_DEVICEMAP);
    case P_VMMMAP:
        return alloc_vmm_mapped(a);
    case P_MIPMAPLAYERED:
        d3.Width = 512;
        d3.Height = 512;
        d3.Depth = 32;
        d3.Flags = CUDA_ARRAY3D_LAYERED;
        return cu.cuMipmappedArrayCreate((CUmipmappedArray *)&a->handle, &d3, 100);
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

static CUresult do_free(struct allocation *a)
{
    switch (a->path) {
    case P_ASYNC:
    case P_POOL:
        return cu.cuMemFreeAsync(a->ptr, NULL);
    case P_VMM:
        return cu.cuMemRelease(a->vmm);
    case P_ARRAY:
    case P_ARRAY3D:
        return cu.cuArrayDestroy((CUarray)a->handle);
    case P_MIPMAP:
    case P_MIPMAPLAYERED:
        return cu.cuMipmappedArrayDestroy((CUmipmappedArray)a->handle);
    case P_VMMMAP: {
        CUresult rc = cu.cuMemUnmap(a->ptr, a->size);
        CUresult freed = cu.cuMemAddressFree(a->ptr, a->size);
        return rc != CUDA_SUCCESS ? rc : freed;
    }
    case P_GRAPH:
    case P_GRAPHNODE:
    case P_GRAPHNODE2: {
        /* The graph memory is freed like any stream-ordered allocation. */
        CUresult rc = cu.cuMemFreeAsync(a->ptr, NULL);
        if (rc == CUDA_SUCCESS)
            rc = cu.cuCtxSynchronize();
        cu.cuGraphExecDestroy(a->exec);
        cu.cuGraphDestroy((CUgraph)a->handle);
        return rc;
    }
    case P_HOST:
        return cu.cuMemFreeHost(a->handle);
    default:
        return cu.cuMemFree(a->ptr);
    }
}

static enum path parse_path(const char *text, size_t len)
{
    for (int p = 0; p < P_COUNT; p++)
        if (strlen(path_names[p]) == len && strncmp(path_names[p], text, len) == 0)
            return (enum path)p;
    usage_exit("unknown allocation path");
    return P_COUNT;
}

/* "PATH:SIZE" */
static void parse_alloc(const char *arg, enum path *path, uint64_t *size)
{
    const char *colon = strchr(arg, ':');
    if (colon == NULL || parse_size(colon + 1, size) != 0)
        usage_exit("expected PATH:SIZE");
    *path = parse_path(arg, (size_t)(colon - arg));
}

static void cmd_alloc(const char *arg)
{
    if (nallocs == MAX_ALLOCS)
        usage_exit("too many allocations");
    struct allocation *a = &allocs[nallocs];
    memset(a, 0, sizeof(*a));
    parse_alloc(arg, &a->path, &a->size);
    CUresult rc = do_alloc(a);
    if (rc == CUDA_SUCCESS)
        nallocs++;
    report("alloc", path_names[a->path], a->size, rc);
}

static void cmd_free(void)
{
    if (nallocs == 0)
        usage_exit("free with nothing allocated");
    struct allocation *a = &allocs[--nallocs];
    report("free", path_names[a->path], a->size, do_free(a));
}

static void cmd_fill(const char *arg)
{
    unsigned value = (unsigned)strtoul(arg, NULL, 0);
    int ok = 1, checked = 0;
    for (int i = 0; i < nallocs; i++) {
        struct allocation *a = &allocs[i];
        if (a->path != P_ALLOC && a->path != P_PITCH && a->path != P_MANAGED)
            continue;
        size_t words = a->size / 4;
        uint32_t *back = malloc(words * 4);
        if (back == NULL || cu.cuMemsetD32(a->ptr, value ^ (unsigned)i, words) != CUDA_SUCCESS ||
            cu.cuCtxSynchronize() != CUDA_SUCCESS ||
            cu.cuMemcpyDtoH(back, a->ptr, words * 4) != CUDA_SUCCESS)
            ok = 0;
        for (size_t w = 0; ok && back != NULL && w < words; w += 4093)
            ok = back[w] == (value ^ (unsigned)i) && back[words - 1] == (value ^ (unsigned)i);
        free(back);
        checked++;
    }
    printf("{\"op\":\"fill\",\"checked\":%d,\"ok\":%s}\n", checked, ok ? "true" : "false");
    fflush(stdout);
}

/* The cuCtxCreate variant NAME, reached the probe's way; NULL if the road
 * leads elsewhere (another variant, or nothing). */
static void *ctx_create_fn(const char *name)
{
    void *named = dlsym(road.lib, name);
    if (strcmp(road.how, "dlsym") == 0)
        return named;
    __typeof__(cuGetProcAddress_v2) *gpa =
        (__typeof__(cuGetProcAddress_v2) *)dlsym(road.lib, "cuGetProcAddress_v2");
    void *fn = NULL;
    CUdriverProcAddressQueryResult status;
    if (gpa == NULL || gpa("cuCtxCreate", &fn, road.version, road.flags, &status) != CUDA_SUCCESS)
        return NULL;
    return fn == named ? fn : NULL;
}

static void cmd_ctx(const char *name)
{
    void *fn = ctx_create_fn(name);
    CUcontext ctx = NULL;
    CUresult rc;
    if (fn == NULL) {
        printf("{\"op\":\"ctx\",\"path\":\"%s\",\"size\":0,\"result\":\"wrong-variant\","
               "\"code\":-1}\n", name);
        fflush(stdout);
        return;
    }
    if (strcmp(name, "cuCtxCreate_v4") == 0)
        rc = ((__typeof__(cuCtxCreate_v4) *)fn)(&ctx, NULL, 0, device);
    else if (strcmp(name, "cuCtxCreate_v3") == 0)
        rc = ((__typeof__(cuCtxCreate_v3) *)fn)(&ctx, NULL, 0, 0, device);
    else if (strcmp(name, "cuCtxCreate_v2") == 0 || strcmp(name, "cuCtxCreate") == 0)
        rc = ((__typeof__(cuCtxCreate_v2) *)fn)(&ctx, 0, device);
    else
        usage_exit("ctx: NAME is cuCtxCreate, cuCtxCreate_v2, _v3 or _v4");
    report("ctx", name, 0, rc);
}

static void cmd_meminfo(void)
{
    size_t free_b = 0, total = 0, total_mem = 0;
    CUresult rc = cu.cuMemGetInfo(&free_b, &total);
    CUresult rc2 = cu.cuDeviceTotalMem(&total_mem, device);
    printf("{\"op\":\"meminfo\",\"result\":\"%s\",\"free\":%zu,\"total\":%zu,\"total_mem\":%zu,"
           "\"total_mem_result\":\"%s\"}\n",
           err_name(rc), free_b, total, total_mem, err_name(rc2));
    fflush(stdout);
}

static void cmd_nvml(void)
{
    CUuuid uuid;
    char text[96];
    nvmlDevice_t dev;
    nvmlMemory_t mem = {0, 0, 0};
    if (nv.init == NULL || cu.cuDeviceGetUuid(&uuid, device) != CUDA_SUCCESS) {
        printf("{\"op\":\"nvml\",\"result\":\"unavailable\"}\n");
        fflush(stdout);
        return;
    }
    const unsigned char *b = (const unsigned char *)uuid.bytes;
    snprintf(text, sizeof(text),
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
             b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14],
             b[15]);
    nvmlReturn_t rc = nv.by_uuid(text, &dev);
    if (rc == NVML_SUCCESS)
        rc = nv.memory(dev, &mem);
    nvmlProcessInfo_t infos[64];
    unsigned count = 64;
    nvmlReturn_t prc = rc == NVML_SUCCESS ? nv.processes(dev, &count, infos) : rc;
    printf("{\"op\":\"nvml\",\"result\":%d,\"total\":%llu,\"used\":%llu,\"free\":%llu,"
           "\"processes_result\":%d,\"pids\":[",
           rc, mem.total, mem.used, mem.free, prc);
    for (unsigned i = 0; prc == NVML_SUCCESS && i < count; i++)
        printf("%s%u", i ? "," : "", infos[i].pid);
    printf("],\"mem\":[");
    for (unsigned i = 0; prc == NVML_SUCCESS && i < count; i++)
        printf("%s%llu", i ? "," : "", infos[i].usedGpuMemory);
    printf("]}\n");
    fflush(stdout);
}

static void cmd_trim(void)
{
    CUmemoryPool pool = NULL;
    CUresult rc = cu.cuCtxSynchronize();
    if (rc == CUDA_SUCCESS)
        rc = cu.cuDeviceGetDefaultMemPool(&pool, device);
    if (rc == CUDA_SUCCESS)
        rc = cu.cuMemPoolTrimTo(pool, 0);
    if (rc == CUDA_SUCCESS && own_pool != NULL)
        rc = cu.cuMemPoolTrimTo(own_pool, 0);
    if (rc == CUDA_SUCCESS)
        rc = cu.cuDeviceGraphMemTrim(device);
    report("trim", "", 0, rc);
}

static void cmd_ipc_export(void)
{
    CUipcMemHandle handle;
    if (nallocs == 0)
        usage_exit("ipc-export with nothing allocated");
    CUresult rc = cu.cuIpcGetMemHandle(&handle, allocs[nallocs - 1].ptr);
    printf("{\"op\":\"ipc-export\",\"result\":\"%s\",\"handle\":\"", err_name(rc));
    for (size_t i = 0; rc == CUDA_SUCCESS && i < sizeof(handle.reserved); i++)
        printf("%02x", (unsigned char)handle.reserved[i]);
    printf("\"}\n");
    fflush(stdout);
}

static void cmd_ipc_open(const char *hex)
{
    CUipcMemHandle handle;
    memset(&handle, 0, sizeof(handle));
    if (strlen(hex) != 2 * sizeof(handle.reserved))
        usage_exit("ipc-open needs the exported handle");
    for (size_t i = 0; i < sizeof(handle.reserved); i++) {
        unsigned byte;
        if (sscanf(hex + 2 * i, "%2x", &byte) != 1)
            usage_exit("ipc-open: bad handle");
        handle.reserved[i] = (char)byte;
    }
    CUdeviceptr ptr = 0;
    uint32_t first = 0;
    CUresult rc = cu.cuIpcOpenMemHandle(&ptr, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    if (rc == CUDA_SUCCESS)
        rc = cu.cuMemcpyDtoH(&first, ptr, sizeof(first));
    printf("{\"op\":\"ipc-open\",\"result\":\"%s\",\"first\":%u}\n", err_name(rc), first);
    fflush(stdout);
}

static void cmd_vmm_export(void)
{
    int fd = -1;
    if (nallocs == 0 || allocs[nallocs - 1].path != P_VMM)
        usage_exit("vmm-export needs a vmm allocation");
    CUresult rc = cu.cuMemExportToShareableHandle(&fd, allocs[nallocs - 1].vmm, POSIX_FD_HANDLE, 0);
    printf("{\"op\":\"vmm-export\",\"result\":\"%s\",\"pid\":%d,\"fd\":%d}\n", err_name(rc), (int)getpid(), fd);
    fflush(stdout);
}

static void cmd_vmm_import(const char *arg)
{
    int pid = 0, theirs = 0;
    char path[64];
    if (nallocs == MAX_ALLOCS || sscanf(arg, "%d:%d", &pid, &theirs) != 2)
        usage_exit("expected vmm-import:PID:FD");
    snprintf(path, sizeof(path), "/proc/%d/fd/%d", pid, theirs);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    struct allocation *a = &allocs[nallocs];
    memset(a, 0, sizeof(*a));
    a->path = P_VMMMAP;
    off_t size = fd >= 0 ? lseek(fd, 0, SEEK_END) : -1;
    uint32_t first = 0;
    CUmemAccessDesc access = {{CU_MEM_LOCATION_TYPE_DEVICE, device}, 3 /* read-write */};
    CUresult rc = size > 0 ? cu.cuMemImportFromShareableHandle(&a->vmm, (void *)(intptr_t)fd, POSIX_FD_HANDLE)
                           : CUDA_ERROR_INVALID_VALUE;
    if (fd >= 0)
        close(fd); /* the imported handle holds the memory now */
    if (rc == CUDA_SUCCESS) {
        a->size = (uint64_t)size;
        rc = cu.cuMemAddressReserve(&a->ptr, a->size, 0, 0, 0);
        if (rc == CUDA_SUCCESS && (rc = cu.cuMemMap(a->ptr, a->size, 0, a->vmm, 0)) == CUDA_SUCCESS &&
            (rc = cu.cuMemSetAccess(a->ptr, a->size, &access, 1)) == CUDA_SUCCESS)
            rc = cu.cuMemcpyDtoH(&first, a->ptr, sizeof(first));
        CUresult released = cu.cuMemRelease(a->vmm);
        rc = rc != CUDA_SUCCESS ? rc : released;
    }
    if (rc == CUDA_SUCCESS)
        nallocs++;
    printf("{\"op\":\"vmm-import\",\"result\":\"%s\",\"size\":%lld,\"first\":%u}\n", err_name(rc),
           (long long)size, first);
    fflush(stdout);
}

static void cmd_peer_copy(const char *arg)
{
    char *end = NULL;
    long n = strtol(arg, &end, 10);
    if (end == arg || *end != '\0' || n < 0 || nallocs == 0 || nallocs == MAX_ALLOCS)
        usage_exit("expected peer-copy:N after an allocation");
    const struct allocation *src = &allocs[nallocs - 1];
    struct allocation *dst = &allocs[nallocs];
    memset(dst, 0, sizeof(*dst));
    dst->path = P_ALLOC;
    dst->size = src->size;
    CUcontext here = NULL, there = NULL, popped = NULL;
    CUdevice peer = 0;
    uint32_t first = 0;
    CUresult rc = cu.cuCtxPopCurrent(&here);
    if (rc == CUDA_SUCCESS && (rc = cu.cuDeviceGet(&peer, (int)n)) == CUDA_SUCCESS &&
        (rc = cu.cuDevicePrimaryCtxRetain(&there, peer)) == CUDA_SUCCESS &&
        (rc = cu.cuCtxPushCurrent(there)) == CUDA_SUCCESS) {
        rc = cu.cuCtxEnablePeerAccess(here, 0);
        if (rc == CUDA_SUCCESS)
            rc = cu.cuMemAlloc(&dst->ptr, dst->size);
        cu.cuCtxPopCurrent(&popped);
    }
    if (here != NULL)
        cu.cuCtxPushCurrent(here);
    if (rc == CUDA_SUCCESS)
        rc = cu.cuCtxEnablePeerAccess(there, 0);
    if (rc == CUDA_SUCCESS) {
        nallocs++;
        rc = cu.cuMemcpyPeer(dst->ptr, there, src->ptr, here, src->size);
    }
    if (rc == CUDA_SUCCESS)
        rc = cu.cuMemcpyDtoH(&first, dst->ptr, sizeof(first));
    printf("{\"op\":\"peer-copy\",\"result\":\"%s\",\"first\":%u}\n", err_name(rc), first);
    fflush(stdout);
}

static void cmd_multicast(const char *arg)
{
    CUmulticastObjectProp prop = {.numDevices = 1, .handleTypes = POSIX_FD_HANDLE};
    CUmemGenericAllocationHandle handle = 0;
    uint64_t size = 0;
    if (parse_size(arg, &size) != 0)
        usage_exit("expected multicast:SIZE");
    prop.size = size;
    report("multicast", "", size, cu.cuMulticastCreate(&handle, &prop));
}

static void cmd_churn(const char *arg)
{
    struct allocation a;
    memset(&a, 0, sizeof(a));
    parse_alloc(arg, &a.path, &a.size);
    printf("{\"op\":\"churn\",\"path\":\"%s\"}\n", path_names[a.path]);
    fflush(stdout);
    for (;;)
        if (do_alloc(&a) == CUDA_SUCCESS)
            do_free(&a);
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int compare_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static void cmd_bench(const char *arg)
{
    struct allocation a;
    memset(&a, 0, sizeof(a));
    const char *last = strrchr(arg, ':');
    char spec[64];
    long count = last != NULL ? strtol(last + 1, NULL, 10) : 0;
    if (last == NULL || count < 1 || (size_t)(last - arg) >= sizeof(spec))
        usage_exit("expected bench:PATH:SIZE:N");
    memcpy(spec, arg, (size_t)(last - arg));
    spec[last - arg] = '\0';
    parse_alloc(spec, &a.path, &a.size);
    uint64_t *pairs = calloc((size_t)count, sizeof(*pairs));
    if (pairs == NULL)
        usage_exit("out of memory");
    int errors = 0;
    for (long i = -count / 10 - 1; i < count; i++) { /* the first tenth warms up */
        uint64_t start = now_ns();
        CUresult rc = do_alloc(&a);
        if (rc == CUDA_SUCCESS)
            rc = do_free(&a);
        uint64_t took = now_ns() - start;
        errors += rc != CUDA_SUCCESS;
        if (i >= 0)
            pairs[i] = took;
    }
    uint64_t sum = 0;
    for (long i = 0; i < count; i++)
        sum += pairs[i];
    qsort(pairs, (size_t)count, sizeof(*pairs), compare_u64);
    printf("{\"op\":\"bench\",\"path\":\"%s\",\"size\":%" PRIu64 ",\"pairs\":%ld,"
           "\"errors\":%d,\"median_ns\":%" PRIu64 ",\"p99_ns\":%" PRIu64 ",\"mean_ns\":%" PRIu64
           "}\n",
           path_names[a.path], a.size, count, errors, pairs[count / 2],
           pairs[(size_t)((double)count * 0.99)], sum / (uint64_t)count);
    fflush(stdout);
    free(pairs);
}

static void cmd_limit(const char *arg)
{
    static const char *const names[] = {"stack", "fifo", "heap"}; /* CU_LIMIT_* 0, 1, 2 */
    const char *colon = strchr(arg, ':');
    uint64_t value = 0;
    if (colon == NULL || parse_size(colon + 1, &value) != 0)
        usage_exit("expected limit:NAME:VALUE");
    for (CUlimit l = 0; l < 3; l++)
        if (strlen(names[l]) == (size_t)(colon - arg) && strncmp(names[l], arg, (size_t)(colon - arg)) == 0) {
            report("limit", names[l], value, cu.cuCtxSetLimit(l, (size_t)value));
            return;
        }
    usage_exit("limit NAME is stack, fifo or heap");
}

/* A context destroyed with SIZE still allocated in it. */
static void cmd_ctx_leak(const char *arg)
{
    uint64_t size = 0;
    CUcontext ctx = NULL, primary = NULL;
    CUdeviceptr ptr = 0;
    if (parse_size(arg, &size) != 0)
        usage_exit("expected ctx-leak:SIZE");
    CUresult rc = cu.cuCtxPopCurrent(&primary);
    if (rc == CUDA_SUCCESS)
        rc = cu.cuCtxCreate(&ctx, NULL, 0, 0, device);
    if (rc == CUDA_SUCCESS)
        rc = cu.cuMemAlloc(&ptr, size);
    if (ctx != NULL) {
        CUresult destroyed = cu.cuCtxDestroy(ctx);
        rc = rc != CUDA_SUCCESS ? rc : destroyed;
    }
    if (primary != NULL)
        cu.cuCtxSetCurrent(primary);
    report("ctx-leak", "alloc", size, rc);
}

static void cmd_pool_destroy(void)
{
    CUresult rc = cu.cuMemPoolDestroy(own_pool);
    own_pool = NULL;
    report("pool-destroy", "pool", 0, rc);
}

/* "N:SIZE" */
static void parse_on(const char *arg, const char *what, CUdevice *dev, uint64_t *size)
{
    char *end = NULL;
    long n = strtol(arg, &end, 10);
    if (end == arg || *end != ':' || n < 0 || parse_size(end + 1, size) != 0)
        usage_exit(what);
    *dev = (CUdevice)n;
}

/* Stream-ordered memory that lands on another device than the current
 * context's: on a stream of device N, or from a pool of device N. Left
 * allocated (these probes look at where it is charged). */
static void cmd_async_on(const char *arg)
{
    CUdevice dev;
    uint64_t size;
    parse_on(arg, "expected async-on:N:SIZE", &dev, &size);
    CUcontext other = NULL, popped = NULL;
    CUstream stream = NULL;
    CUdeviceptr ptr = 0;
    CUresult rc = cu.cuDevicePrimaryCtxRetain(&other, dev);
    if (rc == CUDA_SUCCESS && (rc = cu.cuCtxPushCurrent(other)) == CUDA_SUCCESS) {
        rc = cu.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING);
        cu.cuCtxPopCurrent(&popped);
    }
    if (rc == CUDA_SUCCESS)
        rc = cu.cuMemAllocAsync(&ptr, size, stream);
    report("async-on", "async", size, rc);
}

static void cmd_pool_on(const char *arg)
{
    CUdevice dev;
    uint64_t size;
    parse_on(arg, "expected pool-on:N:SIZE", &dev, &size);
    CUmemPoolProps props;
    memset(&props, 0, sizeof(props));
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = dev;
    CUmemoryPool pool = NULL;
    CUdeviceptr ptr = 0;
    CUresult rc = cu.cuMemPoolCreate(&pool, &props);
    if (rc == CUDA_SUCCESS)
        rc = cu.cuMemAllocFromPoolAsync(&ptr, size, pool, NULL);
    report("pool-on", "pool", size, rc);
}

/* Memory of any allocation type and location type, on the three roads that
 * take both: what the hook lets through of a kind it cannot account for. */
static void cmd_kind(const char *arg)
{
    char *end;
    long type = strtol(arg, &end, 10);
    long where = *end == ':' ? strtol(end + 1, &end, 10) : -1;
    uint64_t size;
    if (where < 0 || *end != ':' || parse_size(end + 1, &size) != 0)
        usage_exit("expected kind:A:L:SIZE");
    CUmemLocation loc = {.type = (int)where, .id = device};
    CUmemPoolProps props;
    memset(&props, 0, sizeof(props));
    props.allocType = (int)type;
    props.location = loc;
    CUmemoryPool pool = NULL;
    report("kind", "pool", size, cu.cuMemPoolCreate(&pool, &props));
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    prop.type = (int)type;
    prop.location = loc;
    CUmemGenericAllocationHandle handle = 0;
    report("kind", "vmm", size, cu.cuMemCreate(&handle, size, &prop, 0));
    CUgraph graph = NULL;
    CUresult rc = cu.cuGraphCreate(&graph, 0);
    CUDA_MEM_ALLOC_NODE_PARAMS params;
    memset(&params, 0, sizeof(params));
    params.poolProps = props;
    params.bytesize = size;
    CUgraphNode node;
    if (rc == CUDA_SUCCESS)
        rc = cu.cuGraphAddMemAllocNode(&node, graph, NULL, 0, &params);
    report("kind", "graph", size, rc);
}

static void cmd_vmm_retain(const char *arg)
{
    struct allocation a = {.path = P_VMMMAP};
    if (parse_size(arg, &a.size) != 0)
        usage_exit("expected vmm-retain:SIZE");
    CUmemGenericAllocationHandle again = 0;
    CUresult rc = alloc_vmm_mapped(&a);
    if (rc == CUDA_SUCCESS)
        rc = cu.cuMemRetainAllocationHandle(&again, (void *)(uintptr_t)a.ptr);
    if (rc == CUDA_SUCCESS)
        rc = do_free(&a);
    report("vmm-retain", "vmm", a.size, rc);
}

static void cmd_capture(const char *arg)
{
    uint64_t size = 0;
    if (parse_size(arg, &size) != 0)
        usage_exit("expected capture:SIZE");
    CUstream stream = NULL;
    CUgraph graph = NULL;
    CUgraphExec exec = NULL;
    CUdeviceptr ptr = 0;
    CUresult rc = cu.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING);
    if (rc == CUDA_SUCCESS)
        rc = cu.cuStreamBeginCapture(stream, 2 /* relaxed */);
    if (rc == CUDA_SUCCESS) {
        rc = cu.cuMemAllocAsync(&ptr, size, stream);
        if (rc == CUDA_SUCCESS)
            rc = cu.cuMemFreeAsync(ptr, stream);
        CUresult ended = cu.cuStreamEndCapture(stream, &graph);
        rc = rc != CUDA_SUCCESS ? rc : ended;
    }
    if (rc == CUDA_SUCCESS)
        rc = cu.cuGraphInstantiateWithFlags(&exec, graph, 0);
    if (rc == CUDA_SUCCESS)
        rc = cu.cuGraphLaunch(exec, stream);
    if (rc == CUDA_SUCCESS)
        rc = cu.cuCtxSynchronize();
    if (exec != NULL)
        cu.cuGraphExecDestroy(exec);
    if (graph != NULL)
        cu.cuGraphDestroy(graph);
    report("capture", "async", size, rc);
}

static void cmd_pools(const char *arg)
{
    CUdevice count;
    uint64_t size;
    parse_on(arg, "expected pools:N:SIZE", &count, &size);
    CUmemPoolProps props;
    memset(&props, 0, sizeof(props));
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = device;
    CUmemoryPool pool = NULL;
    CUdeviceptr ptr = 0;
    CUresult rc = CUDA_SUCCESS;
    for (CUdevice i = 0; i < count && rc == CUDA_SUCCESS; i++) {
        rc = cu.cuMemPoolCreate(&pool, &props);
        if (rc == CUDA_SUCCESS)
            rc = cu.cuMemAllocFromPoolAsync(&ptr, i + 1 < count ? 4096 : size, pool, NULL);
        if (rc == CUDA_SUCCESS)
            rc = cu.cuMemFreeAsync(ptr, NULL);
    }
    report("pools", "pool", size, rc);
}

/* A graph that allocates and frees SIZE, destroyed before any
 * instantiation: its memory never existed. */
static void cmd_graph_drop(const char *arg)
{
    uint64_t size = 0;
    if (parse_size(arg, &size) != 0)
        usage_exit("expected graph-drop:SIZE");
    CUgraph graph = NULL;
    CUgraphNode node;
    CUdeviceptr ptr = 0;
    CUresult rc = cu.cuGraphCreate(&graph, 0);
    if (rc == CUDA_SUCCESS)
        rc = add_alloc_node(P_GRAPH, graph, size, &ptr);
    if (rc == CUDA_SUCCESS)
        rc = cu.cuGraphAddMemFreeNode(&node, graph, NULL, 0, ptr);
    if (graph != NULL) {
        CUresult destroyed = cu.cuGraphDestroy(graph);
        rc = rc != CUDA_SUCCESS ? rc : destroyed;
    }
    report("graph-drop", "graph", size, rc);
}

static void cmd_graph_keep(const char *arg)
{
    if (nallocs == MAX_ALLOCS)
        usage_exit("too many allocations");
    struct allocation *a = &allocs[nallocs];
    memset(a, 0, sizeof(*a));
    a->path = P_ALLOC; /* once its graph is gone it is freed like any pointer */
    if (parse_size(arg, &a->size) != 0)
        usage_exit("expected graph-keep:SIZE");
    struct allocation g = {.path = P_GRAPH, .size = a->size};
    CUresult rc = alloc_graph(&g);
    if (rc == CUDA_SUCCESS) {
        cu.cuGraphExecDestroy(g.exec);
        rc = cu.cuGraphDestroy((CUgraph)g.handle);
        a->ptr = g.ptr;
        nallocs++;
    }
    report("graph-keep", "graph", a->size, rc);
}

/* Make ordinal's primary context current: the probe now works on it. */
static CUresult use_device(int ordinal)
{
    CUcontext ctx = NULL;
    CUresult rc = cu.cuDeviceGet(&device, ordinal);
    if (rc == CUDA_SUCCESS)
        rc = cu.cuDevicePrimaryCtxRetain(&ctx, device);
    if (rc == CUDA_SUCCESS)
        rc = cu.cuCtxSetCurrent(ctx);
    return rc;
}

static void cmd_device(const char *arg)
{
    char *end = NULL;
    long n = strtol(arg, &end, 10);
    if (end == arg || *end != '\0' || n < 0 || n > 1023)
        usage_exit("expected device:N");
    report("device", "", (uint64_t)n, use_device((int)n));
}

static void cmd_reinit(void)
{
    CUcontext ctx = NULL;
    CUresult rc = cu.cuInit(0);
    if (rc == CUDA_SUCCESS)
        rc = cu.cuDevicePrimaryCtxRetain(&ctx, device);
    if (rc == CUDA_SUCCESS)
        rc = cu.cuCtxSetCurrent(ctx);
    report("reinit", "", 0, rc);
}

static void cmd_wait(void)
{
    char line[64];
    printf("{\"op\":\"wait\"}\n");
    fflush(stdout);
    if (fgets(line, sizeof(line), stdin) == NULL)
        exit(0);
}

/* true in the child, which goes on with the remaining commands */
static bool cmd_fork(void)
{
    pid_t pid = fork();
    if (pid == 0)
        return true;
    int status = -1;
    if (pid > 0)
        waitpid(pid, &status, 0);
    printf("{\"op\":\"forked\",\"status\":%d}\n", status);
    fflush(stdout);
    return false;
}

static void run(const char *cmd)
{
    if (strncmp(cmd, "alloc:", 6) == 0)
        cmd_alloc(cmd + 6);
    else if (strcmp(cmd, "free") == 0)
        cmd_free();
    else if (strcmp(cmd, "freeall") == 0)
        while (nallocs > 0)
            cmd_free();
    else if (strncmp(cmd, "fill:", 5) == 0)
        cmd_fill(cmd + 5);
    else if (strncmp(cmd, "ctx:", 4) == 0)
        cmd_ctx(cmd + 4);
    else if (strncmp(cmd, "device:", 7) == 0)
        cmd_device(cmd + 7);
    else if (strcmp(cmd, "meminfo") == 0)
        cmd_meminfo();
    else if (strcmp(cmd, "nvml") == 0)
        cmd_nvml();
    else if (strcmp(cmd, "trim") == 0)
        cmd_trim();
    else if (strcmp(cmd, "sync") == 0)
        report("sync", "", 0, cu.cuCtxSynchronize());
    else if (strncmp(cmd, "limit:", 6) == 0)
        cmd_limit(cmd + 6);
    else if (strncmp(cmd, "ctx-leak:", 9) == 0)
        cmd_ctx_leak(cmd + 9);
    else if (strcmp(cmd, "pool-destroy") == 0)
        cmd_pool_destroy();
    else if (strncmp(cmd, "async-on:", 9) == 0)
        cmd_async_on(cmd + 9);
    else if (strncmp(cmd, "pool-on:", 8) == 0)
        cmd_pool_on(cmd + 8);
    else if (strncmp(cmd, "kind:", 5) == 0)
        cmd_kind(cmd + 5);
    else if (strncmp(cmd, "capture:", 8) == 0)
        cmd_capture(cmd + 8);
    else if (strncmp(cmd, "pools:", 6) == 0)
        cmd_pools(cmd + 6);
    else if (strncmp(cmd, "vmm-retain:", 11) == 0)
        cmd_vmm_retain(cmd + 11);
    else if (strncmp(cmd, "graph-keep:", 11) == 0)
        cmd_graph_keep(cmd + 11);
    else if (strncmp(cmd, "graph-drop:", 11) == 0)
        cmd_graph_drop(cmd + 11);
    else if (strcmp(cmd, "ipc-export") == 0)
        cmd_ipc_export();
    else if (strncmp(cmd, "ipc-open:", 9) == 0)
        cmd_ipc_open(cmd + 9);
    else if (strcmp(cmd, "vmm-export") == 0)
        cmd_vmm_export();
    else if (strncmp(cmd, "vmm-import:", 11) == 0)
        cmd_vmm_import(cmd + 11);
    else if (strncmp(cmd, "peer-copy:", 10) == 0)
        cmd_peer_copy(cmd + 10);
    else if (strncmp(cmd, "multicast:", 10) == 0)
        cmd_multicast(cmd + 10);
    else if (strncmp(cmd, "churn:", 6) == 0)
        cmd_churn(cmd + 6);
    else if (strncmp(cmd, "bench:", 6) == 0)
        cmd_bench(cmd + 6);
    else if (strcmp(cmd, "wait") == 0)
        cmd_wait();
    else if (strcmp(cmd, "reinit") == 0)
        cmd_reinit();
    else if (strcmp(cmd, "exit") == 0)
        _exit(0);
    else
        usage_exit("unknown command");
}

/* The object and exported name behind a function pointer. */
static void describe(const void *fn, const char **lib, const char **name)
{
    Dl_info info;
    *lib = "";
    *name = "";
    if (fn == NULL || dladdr(fn, &info) == 0)
        return;
    const char *slash = info.dli_fname ? strrchr(info.dli_fname, '/') : NULL;
    *lib = slash ? slash + 1 : (info.dli_fname ? info.dli_fname : "");
    *name = info.dli_saddr == fn && info.dli_sname ? info.dli_sname : "?";
}

static void print_road(const char *api, const char *symbol, int version, int ptsz, int rc,
                       int status, const void *fn)
{
    const char *lib, *name;
    describe(fn, &lib, &name);
    printf("{\"api\":\"%s\",\"symbol\":\"%s\",\"version\":%d,\"ptsz\":%d,\"rc\":%d,"
           "\"status\":%d,\"lib\":\"%s\",\"name\":\"%s\"}\n",
           api, symbol, version, ptsz, rc, status, lib, name);
}

static int cmd_roads(void)
{
    static const char *const symbols[] = {
        "cuInit", "cuGetProcAddress", "cuMemAlloc", "cuMemFree", "cuMemGetInfo",
        "cuDeviceTotalMem", "cuMemAllocPitch", "cuCtxCreate", "cuCtxDestroy",
        "cuDevicePrimaryCtxRelease", "cuMemAllocAsync", "cuMemFreeAsync",
        "cuMemAllocFromPoolAsync", "cuMemCreate", "cuArrayCreate", "cuLaunchKernel",
        "cuStreamSynchronize", "cuStreamCreate", "cuGetExportTable", "cuNoSuchFunction",
    };
    static const int versions[] = {3000, 11040, 12000, 12080, 13000};
    static const char *const names[] = {
        "cuInit", "cuGetProcAddress", "cuGetProcAddress_v2", "cuMemAlloc", "cuMemAlloc_v2",
        "cuMemAllocAsync_ptsz", "cuMemGetInfo_v2", "cuStreamCreate", "cuGetExportTable",
        "nvmlInit_v2", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetComputeRunningProcesses_v3",
    };
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (cuda == NULL) {
        fprintf(stderr, "vgpu-memprobe: %s\n", dlerror());
        return 1;
    }
    __typeof__(cuGetProcAddress) *gpa1 = (__typeof__(cuGetProcAddress) *)dlsym(cuda, "cuGetProcAddress");
    __typeof__(cuGetProcAddress_v2) *gpa2 =
        (__typeof__(cuGetProcAddress_v2) *)dlsym(cuda, "cuGetProcAddress_v2");
    for (size_t s = 0; s < sizeof(symbols) / sizeof(symbols[0]); s++)
        for (size_t v = 0; v < sizeof(versions) / sizeof(versions[0]); v++)
            for (int ptsz = 0; ptsz < 2; ptsz++) {
                cuuint64_t flags = ptsz ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
                                        : CU_GET_PROC_ADDRESS_DEFAULT;
                void *fn = NULL;
                CUdriverProcAddressQueryResult status = -1;
                int rc = gpa2(symbols[s], &fn, versions[v], flags, &status);
                print_road("v2", symbols[s], versions[v], ptsz, rc, status, rc == 0 ? fn : NULL);
                fn = NULL;
                rc = gpa1(symbols[s], &fn, versions[v], flags);
                print_road("v1", symbols[s], versions[v], ptsz, rc, -1, rc == 0 ? fn : NULL);
            }
    for (size_t n = 0; n < sizeof(names) / sizeof(names[0]); n++) {
        void *lib = strncmp(names[n], "nvml", 4) == 0 ? nvml : cuda;
        print_road("dlsym", names[n], 0, 0, 0, 0, lib ? dlsym(lib, names[n]) : NULL);
        print_road("dlsym-default", names[n], 0, 0, 0, 0, dlsym(RTLD_DEFAULT, names[n]));
        print_road("dlsym-next", names[n], 0, 0, 0, 0, dlsym(RTLD_NEXT, names[n]));
    }
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv)
{
    static const struct option options[] = {
        {"device", required_argument, NULL, 'd'},
        {"resolve", required_argument, NULL, 'r'},
        {"cuda-version", required_argument, NULL, 'v'},
        {"ptsz", no_argument, NULL, 'p'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *how = "procaddr";
    int version = 12080, ptsz = 0, ordinal = 0, opt;
    while ((opt = getopt_long(argc, argv, "+", options, NULL)) != -1) {
        switch (opt) {
        case 'd': ordinal = atoi(optarg); break;
        case 'r': how = optarg; break;
        case 'v': version = atoi(optarg); break;
        case 'p': ptsz = 1; break;
        case 'h': fputs(USAGE, stdout); return 0;
        default: usage_exit("bad option");
        }
    }
    if (optind < argc && strcmp(argv[optind], "roads") == 0)
        return cmd_roads();
    if (strcmp(how, "dlsym") != 0 && strcmp(how, "procaddr") != 0)
        usage_exit("--resolve is dlsym or procaddr");
    if (resolve_cuda(how, version, ptsz) != 0)
        return 1;
    resolve_nvml();
    if (cu.cuInit == NULL || cu.cuGetErrorName == NULL) {
        printf("{\"op\":\"init\",\"path\":\"\",\"size\":0,\"result\":\"unresolved\",\"code\":-1}\n");
        return 1;
    }
    CUresult rc = cu.cuInit(0);
    if (rc == CUDA_SUCCESS)
        rc = use_device(ordinal);
    report("init", "", 0, rc);
    if (rc != CUDA_SUCCESS)
        return 1;
    for (int i = optind; i < argc; i++) {
        if (strcmp(argv[i], "fork") == 0)
            cmd_fork();
        else
            run(argv[i]);
    }
    return 0;
}
