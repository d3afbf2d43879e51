#!/usr/bin/env bash
# The GPU node has the frameworks but not vgpud's own dependencies, and it
# cannot reach PyPI: fetch them here, for its Python (3.12, x86-64), into
# .whl/ (git-ignored), which campaign.sh installs from when it is there.
#   tests/gpu/wheels.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >>.git/info/exclude
rm -rf .whl && mkdir .whl
platforms=()
for p in manylinux_2_28 manylinux_2_17 manylinux2014 manylinux_2_12 manylinux2010 manylinux_2_5 manylinux1; do
  platforms+=(--platform "${p}_x86_64")
done
# vgpud's runtime dependencies and what they need, plus the pytest plugin
# tests/gpu uses; sdnotify ships no wheel, so it is built here (pure Python).
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${platforms[@]}" -d .whl \
  structlog aiohttp multidict yarl frozenlist aiosignal attrs propcache aiohappyeyeballs \
  idna nvidia-ml-py psutil prometheus-client 'pytest-asyncio<2'
python3 -m pip wheel -q --no-deps -w .whl 'sdnotify==0.3.2'
ls .whl
