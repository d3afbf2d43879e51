"""the answers: the node's snapshot (what every answer renders from), the
service, the HTTP API, Prometheus metrics and the event log. Imports the
base, vgpus, observe and policy.
"""
