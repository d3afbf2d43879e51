"""the ticks: sample (NVML's figures in), control (quotas and heartbeats
out) and scan (tracker, events, reaper, backstop). Imports every stage
below the daemon.
"""
