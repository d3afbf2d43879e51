#!/bin/bash
# Boots systemd as PID 1 of its own PID, mount, UTS, IPC, network and cgroup
# namespaces, with vgpud installed in it, for tests/e2e/test_systemd.py.
#
#   boot.sh CGROUP MARKER STAGE UNITS SIM CHECKOUT
#
# CGROUP  an empty cgroup v2 directory made for this boot: it becomes the
#         namespace's cgroup root (systemd needs a writable hierarchy)
# MARKER  a file name present in the host's /tmp and /var/tmp: the boot is
#         refused unless the namespace's /tmp and /var/tmp do NOT show it
# STAGE   a `make install DESTDIR=` tree, copied into the namespace's /
# UNITS   the test's unit directory: the ONLY place units are loaded from
# SIM     build/sim (the simulated driver), put where `--sim` looks for it
# CHECKOUT the repository the tests run from (its build/ and Makefile are
#         used inside); if it lies under /tmp or /var/tmp, which are fresh
#         here, it is bind-mounted back at the same path, read-only
#
# Standard output must be a terminal: it becomes the namespace's
# /dev/console, where systemd writes its status and early log.
#
# Safety: the host is never written. Every mount below happens in a private
# mount namespace (propagation private: nothing leaks back). The root is an
# overlay whose writes land in memory; /run, /tmp, /var/tmp, /dev and
# /dev/shm are fresh tmpfs; /proc/sys and /sys are read-only; systemd loads
# units from UNITS alone, runs no generators and starts only
# vgpud-test.target (no host service, no tmpfiles cleaning, no sysctl).
set -euo pipefail

die() {
    echo "boot.sh: $*" >&2
    exit 1
}

if [ "${1:-}" != --inside ]; then
    [ $# -eq 6 ] || die "usage: boot.sh CGROUP MARKER STAGE UNITS SIM CHECKOUT"
    # Join the test's cgroup first: the new cgroup namespace is rooted there.
    echo $$ >"$1/cgroup.procs"
    # --kill-child: if this process dies, the namespace's PID 1 dies with it.
    exec unshare --pid --fork --kill-child --mount --propagation private \
        --uts --ipc --net --cgroup -- "$0" --inside "${@:2}"
fi
shift
marker=$1 stage=$2 units=$3 sim=$4 checkout=$5

# --- a root file system that writes to memory only ---------------------------
# The host's /run is not needed in here: its mount point holds the scratch.
scratch=/run
mount -t tmpfs -o mode=0700,size=2g vgpud-test-scratch "$scratch"
mkdir "$scratch/upper" "$scratch/work" "$scratch/root"
root=$scratch/root
mount -t overlay -o "lowerdir=/,upperdir=$scratch/upper,workdir=$scratch/work" \
    vgpud-test-root "$root"

# --- API file systems -----------------------------------------------------------
mount -t proc -o nosuid,nodev,noexec proc "$root/proc"
for path in sys sysrq-trigger; do
    [ -e "$root/proc/$path" ] || continue
    # remount,bind: this mount only, never the kernel's settings behind it.
    mount --bind "$root/proc/$path" "$root/proc/$path"
    mount -o remount,bind,ro "$root/proc/$path"
done
mount -t sysfs -o ro,nosuid,nodev,noexec sysfs "$root/sys"
mount -t cgroup2 -o nosuid,nodev,noexec cgroup2 "$root/sys/fs/cgroup"

mount -t tmpfs -o mode=0755,nosuid,size=4m vgpud-test-dev "$root/dev"
for node in null:1:3 zero:1:5 full:1:7 random:1:8 urandom:1:9 tty:5:0; do
    IFS=: read -r name major minor <<<"$node"
    mknod -m 0666 "$root/dev/$name" c "$major" "$minor"
done
mkdir "$root/dev/pts" "$root/dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666,mode=0620,nosuid,noexec devpts "$root/dev/pts"
ln -s pts/ptmx "$root/dev/ptmx"
mount -t tmpfs -o mode=1777,nosuid,nodev vgpud-test-shm "$root/dev/shm"
ln -s /proc/self/fd "$root/dev/fd"
for i in 0:stdin 1:stdout 2:stderr; do ln -s "/proc/self/fd/${i%%:*}" "$root/dev/${i#*:}"; done
exec 3>&1 # the terminal, as fd 3 of the command substitution below
console=$(readlink -f /proc/self/fd/3)
exec 3>&-
[ -c "$console" ] || die "standard output is not a terminal: $console"
touch "$root/dev/console"
mount --bind "$console" "$root/dev/console"

# --- the writable places systemd cleans: our own, empty ------------------------
mount -t tmpfs -o mode=0755,nosuid,nodev vgpud-test-run "$root/run"
mount -t tmpfs -o mode=1777,nosuid,nodev vgpud-test-tmp "$root/tmp"
mount -t tmpfs -o mode=1777,nosuid,nodev vgpud-test-vartmp "$root/var/tmp"

# The guard: the host's markers are visible from here (the host side), and
# not from the namespace's /tmp and /var/tmp. Otherwise refuse to boot.
for dir in tmp var/tmp; do
    [ -e "/$dir/$marker" ] || die "marker /$dir/$marker is not on the host"
    [ "$(stat -f -c %T "$root/$dir")" = tmpfs ] || die "/$dir in the namespace is not a tmpfs"
    [ ! -e "$root/$dir/$marker" ] || die "the namespace's /$dir shows the host's: not booting"
done

# A checkout under the host's /tmp or /var/tmp (CI clones land anywhere) is
# hidden by the fresh tmpfs: bring back that one directory, read-only, so
# nothing in here can write to it and systemd sees nothing else of /tmp.
case "$checkout" in
/tmp/* | /var/tmp/*)
    mkdir -p "$root$checkout"
    mount --bind "$checkout" "$root$checkout"
    mount -o remount,bind,ro "$root$checkout"
    ;;
esac

# --- vgpud, installed as `make install` does it on a node ------------------------
# tar, not cp: /lib and friends may be symlinks into /usr (merged /usr), and
# directories that exist keep their modes (the stage's top is 0700).
tar -C "$stage" -cf - . | tar -C "$root" -xf - --keep-directory-symlink --no-overwrite-dir
chroot "$root" sh -c 'getent group vgpud >/dev/null || groupadd --system vgpud'
# On a node where vgpud is installed for real, its recorded vGPUs stay out.
if [ -d "$root/var/lib/vgpud" ]; then
    mount -t tmpfs -o mode=0700 vgpud-test-state "$root/var/lib/vgpud"
fi
# --sim looks for the simulated NVML in lib_dir (/usr/lib/vgpud) first.
mkdir -p "$root/usr/lib/vgpud/sim"
cp -a "$sim/." "$root/usr/lib/vgpud/sim/"

# --- units: the test's, plus the few real ones a boot and a poweroff need -------
testdir=$root/run/vgpud-test
mkdir -p "$testdir/no-generators"
cp -a "$units" "$testdir/units"
for unit in systemd-journald.service systemd-journald.socket sockets.target \
    shutdown.target umount.target final.target poweroff.target systemd-poweroff.service \
    vgpud.service run-vgpud.mount; do
    ln -s "/lib/systemd/system/$unit" "$testdir/units/$unit"
done

# --- become that root, and exec systemd ------------------------------------------
cd "$root"
mkdir .oldroot
pivot_root . .oldroot
umount -l /.oldroot
rmdir /.oldroot
cd /
# container=: systemd's container mode (no clock, module, kmsg or console
# setup). The bounding set keeps the kernel's global settings out of reach.
exec env -i container=vgpud-test PATH=/usr/sbin:/usr/bin:/sbin:/bin \
    SYSTEMD_UNIT_PATH=/run/vgpud-test/units \
    SYSTEMD_GENERATOR_PATH=/run/vgpud-test/no-generators \
    SYSTEMD_ENVIRONMENT_GENERATOR_PATH=/run/vgpud-test/no-generators \
    setpriv --bounding-set -sys_module,-sys_time,-sys_rawio,-syslog,-wake_alarm,-sys_pacct,-mac_admin,-mac_override,-audit_control,-linux_immutable,-perfmon \
    /lib/systemd/systemd --unit=vgpud-test.target
