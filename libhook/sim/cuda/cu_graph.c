/*
 * cu_graph.c - CUDA graphs and stream capture.
 *
 * A graph is an ordered list of nodes; only kernel nodes take device time.
 * Capturing a stream records its launches into a graph instead of running
 * them; launching an instantiated graph queues its kernels, in order, on
 * the stream's timeline. Dependencies are kept in insertion order (the
 * simulated device runs one kernel at a time anyway). Graph memory nodes
 * allocate when added (the simulator backs the address at once); as on the
 * real driver, a graph destroyed before it ever ran takes its allocations
 * with it, while an allocation of a graph that ran and did not free it in
 * the graph outlives the graph until cuMemFree(Async).
 */
#include <stdlib.h>

#include "cu_sim.h"

#define CU_STREAM_CAPTURE_MODE_RELAXED 2

enum node_type { NODE_KERNEL, NODE_MEM_ALLOC, NODE_MEM_FREE };

struct CUgraphNode_st {
    uint32_t tag;
    enum node_type type;
    struct cu_kernel_work work; /* NODE_KERNEL */
    CUdeviceptr ptr;            /* NODE_MEM_ALLOC / NODE_MEM_FREE */
};

struct CUgraph_st {
    uint32_t tag;
    CUgraphNode *nodes;
    size_t count, cap;
};

struct CUgraphExec_st {
    uint32_t tag;
    struct cu_kernel_work *kernels;
    size_t count;
    CUdeviceptr *allocs; /* the graph's memory nodes' addresses */
    size_t nallocs;
};

static bool graph_valid(CUgraph g)
{
    return g != NULL && g->tag == CU_TAG_GRAPH;
}

static CUresult add_node(CUgraph g, const struct CUgraphNode_st *proto, CUgraphNode *out)
{
    if (g->count == g->cap) {
        size_t cap = g->cap ? g->cap * 2 : 16;
        CUgraphNode *grown = realloc(g->nodes, cap * sizeof(*grown));
        if (grown == NULL)
            return CUDA_ERROR_OUT_OF_MEMORY;
        g->nodes = grown;
        g->cap = cap;
    }
    CUgraphNode n = malloc(sizeof(*n));
    if (n == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *n = *proto;
    n->tag = CU_TAG_NODE;
    g->nodes[g->count++] = n;
    if (out != NULL)
        *out = n;
    return CUDA_SUCCESS;
}

CUresult cu_graph_add_kernel(CUgraph g, const struct cu_kernel_work *work, CUgraphNode *node)
{
    return add_node(g, &(struct CUgraphNode_st){.type = NODE_KERNEL, .work = *work}, node);
}

static CUresult check_add(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                          size_t numDependencies)
{
    CUresult r = cu_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (phGraphNode == NULL || (numDependencies > 0 && dependencies == NULL))
        return CUDA_ERROR_INVALID_VALUE;
    return graph_valid(hGraph) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags)
{
    CUresult r = cu_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (phGraph == NULL || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUgraph g = calloc(1, sizeof(*g));
    if (g == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    g->tag = CU_TAG_GRAPH;
    *phGraph = g;
    return CUDA_SUCCESS;
}

/* Did a graph that allocates ptr run? (its memory then exists for real) */
static bool ran(CUdeviceptr ptr)
{
    pthread_mutex_lock(&cu_lock);
    struct cu_alloc *a = cu_table_base(ptr);
    bool launched = a != NULL && a->launched;
    pthread_mutex_unlock(&cu_lock);
    return launched;
}

static bool freed_in(CUgraph g, CUdeviceptr ptr)
{
    for (size_t i = 0; i < g->count; i++)
        if (g->nodes[i]->type == NODE_MEM_FREE && g->nodes[i]->ptr == ptr)
            return true;
    return false;
}

CUresult cuGraphDestroy(CUgraph hGraph)
{
    CUresult r = cu_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (!graph_valid(hGraph))
        return CUDA_ERROR_INVALID_HANDLE;
    for (size_t i = 0; i < hGraph->count; i++) {
        CUgraphNode n = hGraph->nodes[i];
        if (n->type == NODE_MEM_ALLOC && (!ran(n->ptr) || freed_in(hGraph, n->ptr)))
            cu_alloc_free(n->ptr, CU_KIND(CU_ALLOC_DEVICE));
    }
    for (size_t i = 0; i < hGraph->count; i++) {
        hGraph->nodes[i]->tag = CU_TAG_DEAD;
        free(hGraph->nodes[i]);
    }
    free(hGraph->nodes);
    hGraph->tag = CU_TAG_DEAD;
    free(hGraph);
    return CUDA_SUCCESS;
}

CUresult cuGraphAddKernelNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                              size_t numDependencies, const void *nodeParams)
{
    (void)nodeParams; /* an unknown kernel: it runs VGPU_SIM_KERNEL_NS */
    CUresult r = check_add(phGraphNode, hGraph, dependencies, numDependencies);
    if (r != CUDA_SUCCESS)
        return r;
    struct cu_kernel_work work = {.kind = CU_KERNEL_OTHER, .duration = cu_proc->st->config.kernel_ns};
    return cu_graph_add_kernel(hGraph, &work, phGraphNode);
}

static CUresult add_mem_alloc(CUgraphNode *phGraphNode, CUgraph hGraph, CUDA_MEM_ALLOC_NODE_PARAMS *nodeParams)
{
    CUresult r;
    if (nodeParams == NULL || nodeParams->bytesize == 0 ||
        nodeParams->poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    struct cu_device *d;
    r = cu_device_of(nodeParams->poolProps.location.id, &d);
    if (r != CUDA_SUCCESS)
        return r;
    struct cu_alloc *a;
    r = cu_alloc_new(NULL, d->dev, nodeParams->bytesize, CU_ALLOC_DEVICE, &a);
    if (r != CUDA_SUCCESS)
        return r;
    nodeParams->dptr = a->base;
    r = add_node(hGraph, &(struct CUgraphNode_st){.type = NODE_MEM_ALLOC, .ptr = a->base}, phGraphNode);
    if (r != CUDA_SUCCESS)
        cu_alloc_free(nodeParams->dptr, CU_KIND(CU_ALLOC_DEVICE));
    return r;
}

CUresult cuGraphAddMemAllocNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                size_t numDependencies, CUDA_MEM_ALLOC_NODE_PARAMS *nodeParams)
{
    CUresult r = check_add(phGraphNode, hGraph, dependencies, numDependencies);
    return r == CUDA_SUCCESS ? add_mem_alloc(phGraphNode, hGraph, nodeParams) : r;
}

static CUresult add_mem_free(CUgraphNode *phGraphNode, CUgraph hGraph, CUdeviceptr dptr)
{
    if (!cu_range_known(dptr, 1))
        return CUDA_ERROR_INVALID_VALUE;
    return add_node(hGraph, &(struct CUgraphNode_st){.type = NODE_MEM_FREE, .ptr = dptr}, phGraphNode);
}

CUresult cuGraphAddMemFreeNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                               size_t numDependencies, CUdeviceptr dptr)
{
    CUresult r = check_add(phGraphNode, hGraph, dependencies, numDependencies);
    return r == CUDA_SUCCESS ? add_mem_free(phGraphNode, hGraph, dptr) : r;
}

/* The generic road (CUDA 12.2+): memory nodes behave as through their own
 * calls; the simulator models no other node type through it. */
static CUresult add_generic(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                            size_t numDependencies, CUgraphNodeParams *nodeParams)
{
    CUresult r = check_add(phGraphNode, hGraph, dependencies, numDependencies);
    if (r != CUDA_SUCCESS)
        return r;
    if (nodeParams == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (nodeParams->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC)
        return add_mem_alloc(phGraphNode, hGraph, &nodeParams->u.alloc);
    if (nodeParams->type == CU_GRAPH_NODE_TYPE_MEM_FREE)
        return add_mem_free(phGraphNode, hGraph, nodeParams->u.free.dptr);
    return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult cuGraphAddNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                        size_t numDependencies, CUgraphNodeParams *nodeParams)
{
    return add_generic(phGraphNode, hGraph, dependencies, numDependencies, nodeParams);
}

CUresult cuGraphAddNode_v2(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                           const CUgraphEdgeData *dependencyData, size_t numDependencies,
                           CUgraphNodeParams *nodeParams)
{
    (void)dependencyData; /* edges carry no meaning for the simulated device */
    return add_generic(phGraphNode, hGraph, dependencies, numDependencies, nodeParams);
}

static CUresult instantiate(CUgraphExec *phGraphExec, CUgraph hGraph)
{
    CUresult r = cu_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (phGraphExec == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (!graph_valid(hGraph))
        return CUDA_ERROR_INVALID_HANDLE;
    CUgraphExec e = calloc(1, sizeof(*e));
    if (e == NULL || (hGraph->count > 0 && ((e->kernels = calloc(hGraph->count, sizeof(*e->kernels))) == NULL ||
                                            (e->allocs = calloc(hGraph->count, sizeof(*e->allocs))) == NULL))) {
        if (e != NULL)
            free(e->kernels);
        free(e);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    for (size_t i = 0; i < hGraph->count; i++) {
        if (hGraph->nodes[i]->type == NODE_KERNEL)
            e->kernels[e->count++] = hGraph->nodes[i]->work;
        else if (hGraph->nodes[i]->type == NODE_MEM_ALLOC)
            e->allocs[e->nallocs++] = hGraph->nodes[i]->ptr;
    }
    e->tag = CU_TAG_EXEC;
    *phGraphExec = e;
    return CUDA_SUCCESS;
}

/* The legacy ABI (CUDA 10-11): no error node or log to report here. */
CUresult cuGraphInstantiate(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                            char *logBuffer, size_t bufferSize)
{
    (void)phErrorNode;
    (void)logBuffer;
    (void)bufferSize;
    return instantiate(phGraphExec, hGraph);
}

CUresult cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                               char *logBuffer, size_t bufferSize)
{
    (void)phErrorNode;
    (void)logBuffer;
    (void)bufferSize;
    return instantiate(phGraphExec, hGraph);
}

static CUresult instantiate_params(CUgraphExec *phGraphExec, CUgraph hGraph,
                                   CUDA_GRAPH_INSTANTIATE_PARAMS *params)
{
    if (params == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = instantiate(phGraphExec, hGraph);
    params->result_out = r == CUDA_SUCCESS ? 0 : 1; /* CUDA_GRAPH_INSTANTIATE_SUCCESS / _ERROR */
    return r;
}

CUresult cuGraphInstantiateWithParams(CUgraphExec *phGraphExec, CUgraph hGraph,
                                      CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams)
{
    return instantiate_params(phGraphExec, hGraph, instantiateParams);
}

CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *phGraphExec, CUgraph hGraph,
                                           CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams)
{
    return instantiate_params(phGraphExec, hGraph, instantiateParams);
}

CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags)
{
    (void)flags;
    return instantiate(phGraphExec, hGraph);
}

static CUresult graph_launch(CUgraphExec e, CUstream h, bool per_thread)
{
    CUstream s;
    CUresult r = cu_stream_resolve(h, per_thread, &s);
    if (r != CUDA_SUCCESS)
        return r;
    if (e == NULL || e->tag != CU_TAG_EXEC)
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&cu_lock);
    for (size_t i = 0; i < e->nallocs; i++) {
        struct cu_alloc *a = cu_table_base(e->allocs[i]);
        if (a != NULL)
            a->launched = true;
    }
    pthread_mutex_unlock(&cu_lock);
    for (size_t i = 0; i < e->count && r == CUDA_SUCCESS; i++)
        r = cu_kernel_submit(s, &e->kernels[i]);
    return r;
}

CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)
{
    return graph_launch(hGraphExec, hStream, false);
}

CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream)
{
    return graph_launch(hGraphExec, hStream, true);
}

CUresult cuGraphExecDestroy(CUgraphExec hGraphExec)
{
    CUresult r = cu_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (hGraphExec == NULL || hGraphExec->tag != CU_TAG_EXEC)
        return CUDA_ERROR_INVALID_HANDLE;
    hGraphExec->tag = CU_TAG_DEAD;
    free(hGraphExec->kernels);
    free(hGraphExec->allocs);
    free(hGraphExec);
    return CUDA_SUCCESS;
}

CUresult cuDeviceGraphMemTrim(CUdevice device)
{
    struct cu_device *d;
    return cu_device_of(device, &d); /* graph memory is released with its graph */
}

/* ---- stream capture ---- */

static CUresult begin_capture(CUstream h, bool per_thread, int mode)
{
    CUstream s;
    CUresult r = cu_stream_resolve(h, per_thread, &s);
    if (r != CUDA_SUCCESS)
        return r;
    if (mode < 0 || mode > CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    if (s == &s->ctx->legacy)
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; /* the legacy stream cannot be captured */
    if (s->capture != NULL)
        return CUDA_ERROR_ILLEGAL_STATE;
    CUgraph g = calloc(1, sizeof(*g));
    if (g == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    g->tag = CU_TAG_GRAPH;
    s->capture = g;
    return CUDA_SUCCESS;
}

CUresult cuStreamBeginCapture(CUstream hStream)
{
    return begin_capture(hStream, false, 0);
}

CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode)
{
    return begin_capture(hStream, false, mode);
}

CUresult cuStreamBeginCapture_ptsz(CUstream hStream)
{
    return begin_capture(hStream, true, 0);
}

CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode)
{
    return begin_capture(hStream, true, mode);
}

static CUresult end_capture(CUstream h, bool per_thread, CUgraph *phGraph)
{
    CUstream s;
    CUresult r = cu_stream_resolve(h, per_thread, &s);
    if (r != CUDA_SUCCESS)
        return r;
    if (phGraph == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (s->capture == NULL)
        return CUDA_ERROR_ILLEGAL_STATE;
    *phGraph = s->capture;
    s->capture = NULL;
    return CUDA_SUCCESS;
}

CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph)
{
    return end_capture(hStream, false, phGraph);
}

CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph)
{
    return end_capture(hStream, true, phGraph);
}

static CUresult is_capturing(CUstream h, bool per_thread, CUstreamCaptureStatus *status)
{
    CUstream s;
    if (status == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cu_stream_resolve(h, per_thread, &s);
    if (r != CUDA_SUCCESS)
        return r;
    *status = s->capture != NULL ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
    return CUDA_SUCCESS;
}

CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus)
{
    return is_capturing(hStream, false, captureStatus);
}

CUresult cuStreamIsCapturing_ptsz(CUstream hStream, CUstreamCaptureStatus *captureStatus)
{
    return is_capturing(hStream, true, captureStatus);
}
