"""hold: what a vGPU is, the node's vGPUs, their shared-memory blocks, the
state file, the recipe and the CDI specs. Imports only the base modules.
"""
