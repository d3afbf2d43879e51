"""the ticks: sample (NVML's figures in), control (quotas and heartbeats
out) and scan (tracker, events, and through repairs the reaper's repairs
and the backstop's kills). Imports every stage below the daemon.
"""
