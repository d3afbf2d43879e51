"""vgpud: GPU sharing with hard isolation on one node."""

__version__ = "0.1.0"
