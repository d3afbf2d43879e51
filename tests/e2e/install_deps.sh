#!/bin/sh
# Install what tests/e2e needs from the distribution's packages: podman and
# runc (the container runtime the tests drive) and, when the host has no
# busybox at all, busybox-static (the shell inside the test root
# filesystem). Nothing is installed that is already there; `apt-get update`
# runs at most once. Without root, or without apt, it says so and exits 0:
# tests/e2e then skips with the same reason.
set -eu

missing=""
command -v podman >/dev/null 2>&1 || missing="$missing podman"
command -v runc >/dev/null 2>&1 || [ -x /usr/sbin/runc ] || missing="$missing runc"
command -v busybox >/dev/null 2>&1 || [ -x /bin/busybox ] || missing="$missing busybox-static"

if [ -z "$missing" ]; then
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "e2e-deps: not root, cannot install:$missing (tests/e2e will be skipped)"
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "e2e-deps: no apt-get; install$missing by hand (tests/e2e will be skipped)"
    exit 0
fi
echo "e2e-deps: installing$missing"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086 # one word per package
apt-get install -y -qq $missing
