"""the ticks: control (quotas and heartbeats out) and scan (tracker, events,
reaper, backstop). Imports every stage below the daemon.
"""
