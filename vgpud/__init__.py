"""vgpud: GPU sharing with hard isolation on one node."""

# The version of everything vgpud ships: pyproject.toml reads it from here,
# and the Makefile builds it into libvgpu.so (vgpu_version()). CHANGELOG.md
# says what each one changed.
__version__ = "0.1.0"
