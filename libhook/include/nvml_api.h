/*
 * nvml_api.h - the NVML types and functions vgpud touches, declared from
 * the public NVML reference (no NVIDIA header at build time).
 *
 * NVML_API_LIST(X) is the one list of entry points: the hook intercepts
 * the ones that show a process its slice, the simulator implements all of
 * them (pynvml in the daemon calls most of them).
 */
#ifndef VGPU_NVML_API_H
#define VGPU_NVML_API_H

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct nvmlEventSet_st *nvmlEventSet_t;
typedef int nvmlEnableState_t;
typedef int nvmlGpuTopologyLevel_t;
typedef int nvmlTemperatureSensors_t;
typedef int nvmlClockType_t;
typedef int nvmlSamplingType_t;
typedef int nvmlValueType_t;

#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_NO_PERMISSION 4
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_DRIVER_NOT_LOADED 9
#define NVML_ERROR_TIMEOUT 10
#define NVML_ERROR_FUNCTION_NOT_FOUND 13
#define NVML_ERROR_GPU_IS_LOST 15
#define NVML_ERROR_UNKNOWN 999

#define NVML_GPU_UTILIZATION_SAMPLES 1
#define NVML_VALUE_TYPE_UNSIGNED_INT 1

#define NVML_DEVICE_UUID_V2_BUFFER_SIZE 96
#define NVML_DEVICE_NAME_V2_BUFFER_SIZE 96
#define NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE 80

#define NVML_EVENT_TYPE_SINGLE_BIT_ECC_ERROR 0x0000000000000001ULL
#define NVML_EVENT_TYPE_DOUBLE_BIT_ECC_ERROR 0x0000000000000002ULL
#define NVML_EVENT_TYPE_XID_CRITICAL_ERROR 0x0000000000000008ULL

#define NVML_TOPOLOGY_INTERNAL 0
#define NVML_TOPOLOGY_SINGLE 10
#define NVML_TOPOLOGY_MULTIPLE 20
#define NVML_TOPOLOGY_HOSTBRIDGE 30
#define NVML_TOPOLOGY_NODE 40
#define NVML_TOPOLOGY_SYSTEM 50

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;
#define nvmlMemory_v2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2u << 24)))

/* nvmlDeviceGet*RunningProcesses (v1) */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;

/* _v2 and _v3 of the same queries */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t;

typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil;
    unsigned int memUtil;
    unsigned int encUtil;
    unsigned int decUtil;
} nvmlProcessUtilizationSample_t;

typedef struct {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

typedef struct {
    char busIdLegacy[16];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct {
    unsigned int multiprocessorCount;
    unsigned int sharedCopyEngineCount;
    unsigned int sharedDecoderCount;
    unsigned int sharedEncoderCount;
    unsigned int sharedJpegCount;
    unsigned int sharedOfaCount;
    unsigned int gpuInstanceSliceCount;
    unsigned int computeInstanceSliceCount;
    unsigned long long memorySizeMB;
} nvmlDeviceAttributes_t;

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;

typedef union {
    double dVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    signed long long sllVal;
    int siVal;
    unsigned short usVal;
} nvmlValue_t;

typedef struct {
    unsigned long long timeStamp; /* CPU time, microseconds */
    nvmlValue_t sampleValue;
} nvmlSample_t;

_Static_assert(sizeof(nvmlSample_t) == 16, "nvmlSample_t ABI");
_Static_assert(sizeof(nvmlProcessInfo_v1_t) == 16, "nvmlProcessInfo_v1_t ABI");
_Static_assert(sizeof(nvmlProcessInfo_t) == 24, "nvmlProcessInfo_t ABI");
_Static_assert(sizeof(nvmlProcessUtilizationSample_t) == 32, "nvmlProcessUtilizationSample_t ABI");
_Static_assert(sizeof(nvmlMemory_v2_t) == 40, "nvmlMemory_v2_t ABI");
_Static_assert(sizeof(nvmlPciInfo_t) == 68, "nvmlPciInfo_t ABI");

#define NVML_API_LIST(X) \
    X(nvmlReturn_t, nvmlInit, (void), ()) \
    X(nvmlReturn_t, nvmlInit_v2, (void), ()) \
    X(nvmlReturn_t, nvmlInitWithFlags, (unsigned int flags), (flags)) \
    X(nvmlReturn_t, nvmlShutdown, (void), ()) \
    X(const char *, nvmlErrorString, (nvmlReturn_t result), (result)) \
    X(nvmlReturn_t, nvmlSystemGetDriverVersion, (char *version, unsigned int length), (version, length)) \
    X(nvmlReturn_t, nvmlSystemGetNVMLVersion, (char *version, unsigned int length), (version, length)) \
    X(nvmlReturn_t, nvmlSystemGetCudaDriverVersion, (int *cudaDriverVersion), (cudaDriverVersion)) \
    X(nvmlReturn_t, nvmlSystemGetCudaDriverVersion_v2, (int *cudaDriverVersion), (cudaDriverVersion)) \
    X(nvmlReturn_t, nvmlDeviceGetCount, (unsigned int *deviceCount), (deviceCount)) \
    X(nvmlReturn_t, nvmlDeviceGetCount_v2, (unsigned int *deviceCount), (deviceCount)) \
    X(nvmlReturn_t, nvmlDeviceGetHandleByIndex, (unsigned int index, nvmlDevice_t *device), (index, device)) \
    X(nvmlReturn_t, nvmlDeviceGetHandleByIndex_v2, (unsigned int index, nvmlDevice_t *device), (index, device)) \
    X(nvmlReturn_t, nvmlDeviceGetHandleByUUID, (const char *uuid, nvmlDevice_t *device), (uuid, device)) \
    X(nvmlReturn_t, nvmlDeviceGetHandleByPciBusId_v2, (const char *pciBusId, nvmlDevice_t *device), (pciBusId, device)) \
    X(nvmlReturn_t, nvmlDeviceGetIndex, (nvmlDevice_t device, unsigned int *index), (device, index)) \
    X(nvmlReturn_t, nvmlDeviceGetName, (nvmlDevice_t device, char *name, unsigned int length), (device, name, length)) \
    X(nvmlReturn_t, nvmlDeviceGetUUID, (nvmlDevice_t device, char *uuid, unsigned int length), (device, uuid, length)) \
    X(nvmlReturn_t, nvmlDeviceGetMinorNumber, (nvmlDevice_t device, unsigned int *minorNumber), (device, minorNumber)) \
    X(nvmlReturn_t, nvmlDeviceGetPciInfo_v3, (nvmlDevice_t device, nvmlPciInfo_t *pci), (device, pci)) \
    X(nvmlReturn_t, nvmlDeviceGetAttributes_v2, (nvmlDevice_t device, nvmlDeviceAttributes_t *attributes), (device, attributes)) \
    X(nvmlReturn_t, nvmlDeviceGetMemoryInfo, (nvmlDevice_t device, nvmlMemory_t *memory), (device, memory)) \
    X(nvmlReturn_t, nvmlDeviceGetMemoryInfo_v2, (nvmlDevice_t device, nvmlMemory_v2_t *memory), (device, memory)) \
    X(nvmlReturn_t, nvmlDeviceGetUtilizationRates, (nvmlDevice_t device, nvmlUtilization_t *utilization), (device, utilization)) \
    X(nvmlReturn_t, nvmlDeviceGetSamples, (nvmlDevice_t device, nvmlSamplingType_t type, unsigned long long lastSeenTimeStamp, nvmlValueType_t *sampleValType, unsigned int *sampleCount, nvmlSample_t *samples), (device, type, lastSeenTimeStamp, sampleValType, sampleCount, samples)) \
    X(nvmlReturn_t, nvmlDeviceGetProcessUtilization, (nvmlDevice_t device, nvmlProcessUtilizationSample_t *utilization, unsigned int *processSamplesCount, unsigned long long lastSeenTimeStamp), (device, utilization, processSamplesCount, lastSeenTimeStamp)) \
    X(nvmlReturn_t, nvmlDeviceGetComputeRunningProcesses, (nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_v1_t *infos), (device, infoCount, infos)) \
    X(nvmlReturn_t, nvmlDeviceGetComputeRunningProcesses_v2, (nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_t *infos), (device, infoCount, infos)) \
    X(nvmlReturn_t, nvmlDeviceGetComputeRunningProcesses_v3, (nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_t *infos), (device, infoCount, infos)) \
    X(nvmlReturn_t, nvmlDeviceGetGraphicsRunningProcesses, (nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_v1_t *infos), (device, infoCount, infos)) \
    X(nvmlReturn_t, nvmlDeviceGetGraphicsRunningProcesses_v2, (nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_t *infos), (device, infoCount, infos)) \
    X(nvmlReturn_t, nvmlDeviceGetGraphicsRunningProcesses_v3, (nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_t *infos), (device, infoCount, infos)) \
    X(nvmlReturn_t, nvmlDeviceGetMPSComputeRunningProcesses, (nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_v1_t *infos), (device, infoCount, infos)) \
    X(nvmlReturn_t, nvmlDeviceGetMPSComputeRunningProcesses_v2, (nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_t *infos), (device, infoCount, infos)) \
    X(nvmlReturn_t, nvmlDeviceGetMPSComputeRunningProcesses_v3, (nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_t *infos), (device, infoCount, infos)) \
    X(nvmlReturn_t, nvmlDeviceGetCudaComputeCapability, (nvmlDevice_t device, int *major, int *minor), (device, major, minor)) \
    X(nvmlReturn_t, nvmlDeviceGetMigMode, (nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode), (device, currentMode, pendingMode)) \
    X(nvmlReturn_t, nvmlDeviceGetTopologyCommonAncestor, (nvmlDevice_t device1, nvmlDevice_t device2, nvmlGpuTopologyLevel_t *pathInfo), (device1, device2, pathInfo)) \
    X(nvmlReturn_t, nvmlDeviceGetTemperature, (nvmlDevice_t device, nvmlTemperatureSensors_t sensorType, unsigned int *temp), (device, sensorType, temp)) \
    X(nvmlReturn_t, nvmlDeviceGetPowerUsage, (nvmlDevice_t device, unsigned int *power), (device, power)) \
    X(nvmlReturn_t, nvmlDeviceGetSupportedEventTypes, (nvmlDevice_t device, unsigned long long *eventTypes), (device, eventTypes)) \
    X(nvmlReturn_t, nvmlEventSetCreate, (nvmlEventSet_t *set), (set)) \
    X(nvmlReturn_t, nvmlDeviceRegisterEvents, (nvmlDevice_t device, unsigned long long eventTypes, nvmlEventSet_t set), (device, eventTypes, set)) \
    X(nvmlReturn_t, nvmlEventSetWait_v2, (nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms), (set, data, timeoutms)) \
    X(nvmlReturn_t, nvmlEventSetFree, (nvmlEventSet_t set), (set))

#define NVML_API_DECLARE(ret, name, params, args) ret name params;
NVML_API_LIST(NVML_API_DECLARE)
#undef NVML_API_DECLARE

#endif
