"""The HTTP API on /run/vgpud.sock."""
