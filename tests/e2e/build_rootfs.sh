#!/bin/sh
# build_rootfs.sh DEST [BUILD] - a minimal root filesystem for test
# containers, for `podman run --rootfs DEST` (no image registry needed).
#
# It holds busybox (a shell and the usual tools), BUILD/vgpu-burn, a static
# vgpu-probe (tests/e2e/probe.c), the simulated driver libraries BUILD/sim/*
# where a real driver's libraries would be (the NVIDIA container toolkit
# injects them on a GPU node; here they stand in for it), and every shared
# library these need, per ldd. The vGPU library itself is NOT copied: CDI or
# -v mounts it, as on a real node.
set -eu

dest=${1:?usage: build_rootfs.sh DEST [BUILD]}
build=${2:-build}
here=$(dirname "$0")

busybox=$(command -v busybox || echo /bin/busybox)
for f in "$busybox" "$build/vgpu-burn" "$build/libvgpu.so" \
    "$build/sim/libcuda.so.1" "$build/sim/libnvidia-ml.so.1"; do
    [ -x "$f" ] || [ -f "$f" ] || { echo "build_rootfs: missing $f" >&2; exit 1; }
done

mkdir -p "$dest/bin" "$dest/usr/bin" "$dest/tmp" "$dest/run" "$dest/proc" "$dest/dev" "$dest/sys"
chmod 1777 "$dest/tmp"

# Copy a file to the same absolute path under DEST, following symlinks.
copy_as_is() {
    mkdir -p "$dest$(dirname "$1")"
    cp -L "$1" "$dest$1"
}

# Every library ldd names for a binary or library (the loader included).
copy_libraries() {
    ldd "$1" 2>/dev/null | while read -r first arrow path _; do
        case "$first" in /*) copy_as_is "$first" ;; esac
        case "$arrow:$path" in "=>:/"*) copy_as_is "$path" ;; esac
    done
}

cp -L "$busybox" "$dest/bin/busybox"
for applet in $("$busybox" --list); do
    [ -e "$dest/bin/$applet" ] || ln -s busybox "$dest/bin/$applet"
done
copy_libraries "$busybox"

cp "$build/vgpu-burn" "$dest/usr/bin/vgpu-burn"
copy_libraries "$build/vgpu-burn"
copy_libraries "$build/libvgpu.so"

# The driver's libraries go where the distribution's loader looks by default
# (the directory of libc), as the NVIDIA toolkit would put them.
libdir=$(ldd "$build/vgpu-burn" | sed -n 's|.*=> \(/[^ ]*\)/libc\.so\.6 .*|\1|p')
[ -n "$libdir" ] || { echo "build_rootfs: cannot find libc's directory" >&2; exit 1; }
for lib in libcuda.so.1 libnvidia-ml.so.1; do
    mkdir -p "$dest$libdir"
    cp -L "$build/sim/$lib" "$dest$libdir/$lib"
    copy_libraries "$build/sim/$lib"
done

${CC:-gcc} -std=c11 -D_GNU_SOURCE -O2 -Wall -Wextra -Werror -static \
    -o "$dest/usr/bin/vgpu-probe" "$here/probe.c"
