"""decide: pure functions from what was observed to what should be (quotas,
placement, which bytes to reclaim, which process is over its limit), and the
repairs and kills they call for. Imports the base, vgpus and observe.
"""
