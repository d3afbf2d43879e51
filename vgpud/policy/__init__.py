"""decide: pure functions from what was observed to what should be (quotas,
placement, which bytes to reclaim, which process is over its limit). The
repairs and kills they call for are carried out by loops/repairs.py.
Imports the base, vgpus and observe.
"""
