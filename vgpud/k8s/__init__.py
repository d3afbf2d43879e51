"""vgpud-k8s: the Kubernetes device plugin and DRA driver, clients of vgpud."""
