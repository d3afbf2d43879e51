"""the answers: the service, the HTTP API, Prometheus metrics and the event
log. Imports the base, vgpus, observe and policy.
"""
