"""vgpuctl: the command line over the daemon socket."""
