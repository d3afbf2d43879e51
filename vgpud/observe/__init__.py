"""observe: what the daemon reads of the host (NVML, the CUDA driver, /proc,
cgroups, pidfds) and the tracker that maps host processes to vGPUs. Imports
only the base modules and vgpus.
"""
