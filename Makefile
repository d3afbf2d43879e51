# vgpud - one-command build and test. `make` builds the preload library, the
# simulated driver, the tools and the Python environment; `make test` runs
# every test that needs no GPU (the C tests twice: as built, and under ASan
# and UBSan: `make test-c-asan`); `make test-gpu` runs tests/gpu on a GPU node.

CC      ?= gcc
PYTHON  ?= python3
BUILD   := build
VENV    := .venv
PREFIX  ?= /usr
LIBDIR  ?= $(PREFIX)/lib/vgpud
BINDIR  ?= $(PREFIX)/bin
UNITDIR ?= /lib/systemd/system
# The Python that `make install` builds the daemon's venv with: the system's.
INSTALL_PYTHON ?= /usr/bin/python3

WARN    := -std=c11 -Wall -Wextra -Werror -Wshadow -Wformat=2 -Wstrict-prototypes -Wmissing-prototypes
HARDEN  := -D_FORTIFY_SOURCE=2 -fstack-protector-strong
CFLAGS  ?= -O2 -g
# One version for the daemon and the library: vgpud/__init__.py's.
VERSION := $(shell sed -n 's/^__version__ = "\(.*\)"$$/\1/p' vgpud/__init__.py)
CPPFLAGS += -D_GNU_SOURCE -Ilibhook/include -DVGPU_VERSION='"$(VERSION)"'
SOFLAGS := -shared -fPIC -Wl,-z,relro -Wl,-z,now -Wl,-z,noexecstack
ALL_CFLAGS = $(WARN) $(HARDEN) $(CFLAGS) -fPIC -pthread

# Every compile writes what it included (headers, and the ../src/*.c the C
# tests include) to <target>.d, read back below: a change to any of them
# rebuilds exactly what used it. -MP keeps a deleted header from breaking make.
DEPFLAGS = -MMD -MP -MF $@.d -MT $@

HOOK_SRC  := $(wildcard libhook/src/*.c)
SIMC_SRC  := $(wildcard libhook/sim/common/*.c)
SIMCU_SRC := $(wildcard libhook/sim/cuda/*.c)
SIMNV_SRC := $(wildcard libhook/sim/nvml/*.c)
TOOL_SRC  := $(wildcard libhook/tools/*.c)
ATOM_SRC  := $(wildcard libhook/atomics/*.c)
CTEST_SRC := $(wildcard libhook/tests/test_*.c)

# Objects mirror the source tree: libhook/src/env.c -> build/obj/src/env.o.
objects = $(patsubst libhook/%.c,$(BUILD)/obj/%.o,$(1))
HOOK_OBJ  := $(call objects,$(HOOK_SRC))
SIMC_OBJ  := $(call objects,$(SIMC_SRC))
SIMCU_OBJ := $(call objects,$(SIMCU_SRC))
SIMNV_OBJ := $(call objects,$(SIMNV_SRC))
ATOM_OBJ  := $(call objects,$(ATOM_SRC))

LIB   := $(BUILD)/libvgpu.so
SIMCU := $(BUILD)/sim/libcuda.so.1
SIMNV := $(BUILD)/sim/libnvidia-ml.so.1
ATOMICS := $(BUILD)/libvgpu-atomics.so
TOOLS := $(patsubst libhook/tools/%.c,$(BUILD)/%,$(TOOL_SRC))
CTESTS := $(patsubst libhook/tests/%.c,$(BUILD)/tests/%,$(CTEST_SRC))
# Every C test again under the sanitizers.
ASAN_CTESTS := $(patsubst libhook/tests/%.c,$(BUILD)/asan/tests/%,$(CTEST_SRC))
VENV_STAMP := $(VENV)/.installed
# The kubelet's gRPC APIs (vgpud-k8s): Python modules and typed stubs
# generated from our .proto files with grpcio-tools and mypy-protobuf.
PROTOS    := $(wildcard vgpud/k8s/proto/*/*/api.proto)
PROTO_PY  := $(PROTOS:.proto=_pb2.py)

.PHONY: all lib sim tools venv protos test test-c test-c-asan test-py lint test-gpu demo install uninstall clean bench e2e-deps
all: lib sim tools venv

lib: $(LIB) $(ATOMICS)
sim: $(SIMCU) $(SIMNV)
tools: $(TOOLS)

# One object per source, each with its dependency file. The hook and the
# atomics export only what they mean to (hidden visibility by default); the
# simulator's two libraries share sim/common.
$(BUILD)/obj/%.o: libhook/%.c
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(OBJ_CPPFLAGS) $(ALL_CFLAGS) $(OBJ_CFLAGS) $(DEPFLAGS) -c -o $@ $<
$(BUILD)/obj/src/%.o $(BUILD)/obj/atomics/%.o: OBJ_CFLAGS := -fvisibility=hidden
$(BUILD)/obj/sim/%.o: OBJ_CPPFLAGS := -Ilibhook/sim/common
$(BUILD)/obj/src/init.o: vgpud/__init__.py  # vgpu_version()

# Only the intercepted API leaves the library: hidden visibility by default,
# and a version script as a second fence.
$(LIB): $(HOOK_OBJ) libhook/libvgpu.lds
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) $(SOFLAGS) \
	  -Wl,--version-script=libhook/libvgpu.lds -Wl,-soname,libvgpu.so \
	  -o $@ $(HOOK_OBJ) -ldl -lpthread

# C11 atomics on the shared blocks for the daemon (Python's mmap has none).
$(ATOMICS): $(ATOM_OBJ)
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) $(SOFLAGS) -Wl,-soname,libvgpu-atomics.so -o $@ $(ATOM_OBJ)

# The simulated driver: a test double for machines without a GPU.
$(SIMCU): $(SIMCU_OBJ) $(SIMC_OBJ)
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) $(SOFLAGS) -Wl,-Bsymbolic -Wl,-soname,libcuda.so.1 \
	  -o $@ $(SIMCU_OBJ) $(SIMC_OBJ) -lpthread -lrt
	ln -sf libcuda.so.1 $(BUILD)/sim/libcuda.so

$(SIMNV): $(SIMNV_OBJ) $(SIMC_OBJ)
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) $(SOFLAGS) -Wl,-Bsymbolic -Wl,-soname,libnvidia-ml.so.1 \
	  -o $@ $(SIMNV_OBJ) $(SIMC_OBJ) -lpthread -lrt
	ln -sf libnvidia-ml.so.1 $(BUILD)/sim/libnvidia-ml.so

# Tools talk to whatever libcuda.so.1 the loader finds: the real driver on a
# GPU node, the simulator under LD_LIBRARY_PATH=build/sim.
$(BUILD)/%: libhook/tools/%.c
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(ALL_CFLAGS) $(DEPFLAGS) -o $@ $< -ldl -lpthread -lm

$(BUILD)/tests/%: libhook/tests/%.c
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) -Ilibhook/tests $(ALL_CFLAGS) $(DEPFLAGS) -o $@ $< -ldl -lpthread -lm

# The C tests again under AddressSanitizer and UndefinedBehaviorSanitizer,
# with the hook's and the arbiter's sources they include: any report fails
# the test (-fno-sanitize-recover). Not hardened (_FORTIFY_SOURCE's checks
# and ASan's interceptors overlap) and built at -O1, as ASan advises.
ASAN_CFLAGS := $(WARN) -O1 -g -fno-omit-frame-pointer -pthread \
	-fsanitize=address,undefined -fno-sanitize-recover=all
$(BUILD)/asan/tests/%: libhook/tests/%.c
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) -Ilibhook/tests $(ASAN_CFLAGS) $(DEPFLAGS) -o $@ $< -ldl -lpthread -lm

-include $(addsuffix .d,$(HOOK_OBJ) $(ATOM_OBJ) $(SIMC_OBJ) $(SIMCU_OBJ) $(SIMNV_OBJ) $(TOOLS) $(CTESTS) $(ASAN_CTESTS))

$(VENV_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[dev]'
	touch $@
venv: $(VENV_STAMP) protos

protos: $(PROTO_PY)
vgpud/k8s/proto/%/api_pb2.py: vgpud/k8s/proto/%/api.proto $(VENV_STAMP)
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(VENV)/bin/python -m grpc_tools.protoc -I . \
	  --python_out=. --grpc_python_out=. --mypy_out=. --mypy_grpc_out=. $<

lint: venv
	$(VENV)/bin/ruff check vgpud tests benchmarks demo
	$(VENV)/bin/ruff format --check vgpud tests benchmarks demo
	$(VENV)/bin/mypy vgpud demo tests/unit

test-c: lib sim tools $(CTESTS)
	@set -e; for t in $(CTESTS); do echo "== $$t"; VGPU_BUILD=$(BUILD) $$t; done

# Two tests re-run themselves as workers under LD_PRELOAD=libvgpu.so, so
# ASan's runtime is not first among the preloaded objects; that is safe here
# (the hook exports no function ASan intercepts), hence verify_asan_link_order=0.
test-c-asan: lib sim tools $(ASAN_CTESTS)
	@set -e; for t in $(ASAN_CTESTS); do echo "== $$t"; \
	  VGPU_BUILD=$(BUILD) UBSAN_OPTIONS=print_stacktrace=1 \
	  ASAN_OPTIONS=verify_asan_link_order=0 $$t; done

# podman and runc for tests/e2e (installs only what is missing; needs root).
e2e-deps:
	@tests/e2e/install_deps.sh

test-py: all e2e-deps
	$(VENV)/bin/python -m pytest -q tests/unit tests/integration tests/k8s tests/redteam tests/faults tests/e2e

# e2e-deps first: as root it installs podman and runc, and says so before
# anything else runs (VGPUD_E2E_DEPS=skip: nothing installed, tests/e2e skipped).
test: e2e-deps lint test-c test-c-asan test-py

# The frameworks (PyTorch, JAX, CuPy) live in the node's own Python, not in
# our venv: GPU_PYTHON names it.
GPU_PYTHON ?= python3
test-gpu: lib tools
	$(GPU_PYTHON) -m pytest -q -p no:cacheprovider tests/gpu

demo: all
	$(VENV)/bin/python -m demo

# make install: as root on a node, or with DESTDIR=<dir> to stage a package
# (then creating the group and `systemctl daemon-reload` are left to the
# package's scripts). The daemon and vgpuctl get their own virtual
# environment: Debian's and Ubuntu's system Python refuses pip (PEP 668), and
# our dependencies stay out of the system's. It is built beside the old one
# and swapped in, never rebuilt under a running daemon's feet.
VENV_NEW = $(DESTDIR)$(LIBDIR)/venv.new
install: lib protos
	install -d $(DESTDIR)$(LIBDIR) $(DESTDIR)$(BINDIR) $(DESTDIR)$(UNITDIR) $(DESTDIR)/etc/vgpud
	install -m 0644 $(LIB) $(ATOMICS) $(DESTDIR)$(LIBDIR)/
	rm -rf $(VENV_NEW)
	$(INSTALL_PYTHON) -m venv $(VENV_NEW)
	@# pip builds from a copy: setuptools would write its own build/ into ours.
	src=$$(mktemp -d) && cp -r pyproject.toml vgpud $$src/ && \
	  $(VENV_NEW)/bin/pip install -q --no-compile --root-user-action=ignore $$src; \
	  rc=$$?; rm -rf $$src; exit $$rc
	@# Point the venv at where it will live, and compile it for that place
	@# (the service cannot write byte code: /usr is read-only to it).
	grep -rlF '$(VENV_NEW)' $(VENV_NEW)/bin $(VENV_NEW)/pyvenv.cfg | xargs -r sed -i 's|$(VENV_NEW)|$(LIBDIR)/venv|g'
	$(INSTALL_PYTHON) -m compileall -q -f -s $(VENV_NEW) -p $(LIBDIR)/venv $(VENV_NEW)/lib
	rm -rf $(DESTDIR)$(LIBDIR)/venv.old
	if [ -d $(DESTDIR)$(LIBDIR)/venv ]; then mv $(DESTDIR)$(LIBDIR)/venv $(DESTDIR)$(LIBDIR)/venv.old; fi
	mv $(VENV_NEW) $(DESTDIR)$(LIBDIR)/venv
	rm -rf $(DESTDIR)$(LIBDIR)/venv.old
	ln -sfn $(LIBDIR)/venv/bin/vgpud $(DESTDIR)$(BINDIR)/vgpud
	ln -sfn $(LIBDIR)/venv/bin/vgpuctl $(DESTDIR)$(BINDIR)/vgpuctl
	ln -sfn $(LIBDIR)/venv/bin/vgpud-k8s $(DESTDIR)$(BINDIR)/vgpud-k8s
	install -m 0644 systemd/vgpud-k8s.service systemd/run-vgpud.mount $(DESTDIR)$(UNITDIR)/
	sed 's|^ExecStart=/usr/bin/vgpud |ExecStart=$(BINDIR)/vgpud |' systemd/vgpud.service > $(DESTDIR)$(UNITDIR)/vgpud.service
	chmod 0644 $(DESTDIR)$(UNITDIR)/vgpud.service
	@# An existing config is the admin's: never overwritten.
	test -e $(DESTDIR)/etc/vgpud/vgpud.toml || { \
	  sed 's|^lib_dir = .*|lib_dir = "$(LIBDIR)"|' etc/vgpud.toml > $(DESTDIR)/etc/vgpud/vgpud.toml && \
	  chmod 0644 $(DESTDIR)/etc/vgpud/vgpud.toml; }
	@if [ -z "$(DESTDIR)" ]; then \
	  getent group vgpud >/dev/null || groupadd --system vgpud; \
	  if [ -d /run/systemd/system ]; then systemctl daemon-reload; fi; \
	fi

# Removes what install added; keeps /etc/vgpud (config), /var/lib/vgpud
# (state), /run/vgpud (blocks that running processes may still map) and the
# vgpud group (files may belong to it).
uninstall:
	@if [ -z "$(DESTDIR)" ] && [ -d /run/systemd/system ]; then \
	  for unit in vgpud-k8s.service vgpud.service; do \
	    systemctl disable --now $$unit 2>/dev/null || true; done; fi
	rm -f $(DESTDIR)$(BINDIR)/vgpud $(DESTDIR)$(BINDIR)/vgpuctl $(DESTDIR)$(UNITDIR)/vgpud.service
	rm -f $(DESTDIR)$(BINDIR)/vgpud-k8s $(DESTDIR)$(UNITDIR)/vgpud-k8s.service
	rm -f $(DESTDIR)$(UNITDIR)/run-vgpud.mount
	rm -f $(DESTDIR)$(LIBDIR)/libvgpu.so $(DESTDIR)$(LIBDIR)/libvgpu-atomics.so
	rm -rf $(DESTDIR)$(LIBDIR)/venv $(DESTDIR)$(LIBDIR)/venv.new $(DESTDIR)$(LIBDIR)/venv.old
	rmdir $(DESTDIR)$(LIBDIR) 2>/dev/null || true
	@if [ -z "$(DESTDIR)" ] && [ -d /run/systemd/system ]; then systemctl daemon-reload; fi

clean:
	rm -rf $(BUILD)
