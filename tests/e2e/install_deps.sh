#!/bin/sh
# Install what the tests need from the distribution's packages: podman and
# runc (the container runtime the tests drive) and, when the host has no
# busybox at all, busybox-static (the shell inside the test root
# filesystem). `make test` runs this first, and as root it installs them
# with apt-get, their dependencies included (about 30 packages on Debian
# 12): the first line of output says so, with the count. Nothing is
# installed that is already there, so a second run does nothing; `apt-get
# update` runs at most once. VGPUD_E2E_DEPS=skip installs nothing. Without
# root, or without apt, it says so and exits 0: tests/e2e (and, without
# patch, the ab_inference test that needs it) then skips with the same reason.
set -eu

missing=""
command -v podman >/dev/null 2>&1 || missing="$missing podman"
command -v runc >/dev/null 2>&1 || [ -x /usr/sbin/runc ] || missing="$missing runc"
command -v busybox >/dev/null 2>&1 || [ -x /bin/busybox ] || missing="$missing busybox-static"
# Not e2e's: benchmarks/ab_inference.py applies its build B with patch(1),
# and tests/unit/test_ab_inference.py runs that.
command -v patch >/dev/null 2>&1 || missing="$missing patch"

if [ -z "$missing" ]; then
    exit 0
fi
if [ "${VGPUD_E2E_DEPS:-}" = skip ]; then
    echo "e2e-deps: VGPUD_E2E_DEPS=skip: not installing$missing (the tests that need them will be skipped)"
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "e2e-deps: not root, cannot install:$missing (the tests that need them will be skipped)"
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "e2e-deps: no apt-get; install$missing by hand (the tests that need them will be skipped)"
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086 # one word per package
count=$(apt-get install -s $missing | grep -c '^Inst ' || true)
echo "e2e-deps: installing$missing for the tests with apt-get: $count new packages" \
    "with their dependencies (VGPUD_E2E_DEPS=skip to skip them and tests/e2e)"
# shellcheck disable=SC2086
apt-get install -y -qq $missing
